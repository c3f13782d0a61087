"""Starting jobs: ``mpidist run`` builds the launcher's command line (``runner``), and a
guard process per rank (``guard``, run as ``python -m mpidist.guard``) reports a rank that
dies (``report``). Nothing here starts MPI."""
