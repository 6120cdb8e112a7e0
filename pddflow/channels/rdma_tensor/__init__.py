"""rdma_tensor: KVBlocks between processes of one cluster, written straight into memory the
receiver owns (docs/channels.md, rdma_tensor protocol). The channel kind keeps its graph name; the
classes are named for the mechanism: `protocol.py` (`SharedMemoryKVParams`, the frame formats, the
backend choice), `frames.py` (the frame kinds), `sender.py` (`SharedMemoryKVSender`),
`receiver.py` (`SharedMemoryKVReceiver`), `control_socket.py` (the control connection), and the
region backends under them: `memory_region.py` (the interface), `shm_region.py` (memfd shared
memory), `tcp_region.py` (TCP between hosts), `nixl_region.py` (NIXL where installed). Nothing is
imported here, so a backend loads without pyarrow."""
