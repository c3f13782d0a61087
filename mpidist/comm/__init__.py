"""Layer 2: communicators. ``communicator.Communicator`` runs buffer collectives across MPI
ranks (fingerprint agreement, deadlines, a progress board, the shared-memory all-reduce);
``mpi`` imports MPI lazily and checks the launch; ``nccl`` drives NCCL between local GPUs and
across ranks; ``options`` holds CommunicationOptions."""
