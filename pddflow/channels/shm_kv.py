"""rdma_tensor's public names: the channel kind keeps its graph name, the classes are named for
the mechanism (shared memory the receiver owns; NIXL where installed)."""

from pddflow.channels.shm_kv_protocol import SharedMemoryKVParams
from pddflow.channels.shm_kv_receiver import SharedMemoryKVReceiver
from pddflow.channels.shm_kv_sender import SharedMemoryKVSender

__all__ = ["SharedMemoryKVParams", "SharedMemoryKVReceiver", "SharedMemoryKVSender"]
