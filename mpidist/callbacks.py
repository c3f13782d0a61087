"""``mpidist.callbacks``: hooks into ``mpidist.fit``, checkpointing and backup-and-restore."""

from mpidist.training.callbacks import BackupAndRestore, Callback, History, ModelCheckpoint

__all__ = ["BackupAndRestore", "Callback", "History", "ModelCheckpoint"]
