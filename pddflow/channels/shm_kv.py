"""rdma_tensor: KVBlocks between processes inside a cluster (Prefill -> RelayDecode), written
straight into memory the receiver owns: shared memory between processes on one host, NIXL where
it is installed. The channel kind keeps its graph name; the classes are named for the mechanism.

    shm_kv_protocol.py  params, control frames and region backends, shared by both ends
    shm_kv_receiver.py  SharedMemoryKVReceiver: rings per sender, the landing arena
    shm_kv_sender.py    SharedMemoryKVSender
"""

from pddflow.channels.shm_kv_protocol import SharedMemoryKVParams
from pddflow.channels.shm_kv_receiver import SharedMemoryKVReceiver
from pddflow.channels.shm_kv_sender import SharedMemoryKVSender

__all__ = ["SharedMemoryKVParams", "SharedMemoryKVReceiver", "SharedMemoryKVSender"]
