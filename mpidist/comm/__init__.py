"""Layer 2: communicators. NCCL between the local GPUs of one process today; MPI across ranks
arrives with MultiWorkerMirroredStrategy."""
