"""Layer 2: communicators.

``communicator.Communicator`` runs buffer collectives across MPI ranks. It is made of the
``topology.Topology`` of its ranks, the ``collective_guard.CollectiveGuard`` that numbers,
checks and watches every collective (``collective_call``: the call and its fingerprint;
``deadlines``: the Waiter and the Watchdog; ``failure_reports``: mismatch and missing-rank
messages; ``board``: the progress board; ``rank_state``: the file a dead rank leaves;
``timeline``: the Chrome trace), and its data paths (``gather``, ``shared_memory``).
``mpi`` imports MPI lazily and checks the launch; ``nccl`` drives NCCL between local GPUs and
across ranks; ``options`` holds CommunicationOptions; ``user_traceback`` trims tracebacks to
the user's frames."""
