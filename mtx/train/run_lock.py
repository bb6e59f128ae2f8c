"""One `mtx train` per run directory: `<run_dir>/train.lock`, a lock file with a heartbeat (mtx.lock_file), so
a second command refuses to start.

Two trainings on one run directory would both write `step_<N>.pt` and append to `metrics.jsonl`, and a resume
would continue from whichever checkpoint landed last. Rank 0 holds the lock for the whole run; a requeued SLURM
job takes over the lock its earlier incarnation left (mtx.lock_file says when a lock is stale). A holder that
loses its lock while alive (`lost`, `still_held`) stops every rank before its next checkpoint write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtx.lock_file import LockFile

LOCK_NAME = "train.lock"


class RunLock(LockFile):
    """The exclusive right of one process (rank 0) to train in `run_dir`: `<run_dir>/train.lock`."""

    def __init__(self, run_dir: str | Path, stale_after: float = 300.0, heartbeat: float = 30.0) -> None:
        self.run_dir = Path(run_dir)
        super().__init__(self.run_dir / LOCK_NAME, stale_after, heartbeat)

    def _refusal(self, holder: dict[str, Any] | None, age: float) -> str:
        if holder is None:
            return (f"Run directory {self.run_dir} is being locked by another `mtx train` right now: {self.path} "
                    f"was written {age:.0f} s ago and is not complete. Two trainings in one run directory would "
                    "overwrite each other's checkpoints and metrics.jsonl; train in another run directory, or "
                    f"delete {self.path} if you are sure no other command is starting.")
        return (f"Run directory {self.run_dir} is in use by another `mtx train` ({self.describe(holder, age)}): "
                f"`{holder.get('command') or '?'}`. Two trainings in one run directory would overwrite each other's "
                f"checkpoints and metrics.jsonl. Wait for it to finish, stop it (`kill {holder['pid']}` on "
                f"{holder['host']}: it writes a checkpoint and stops, and the same command resumes), or train in "
                f"another run directory. {self.stale_advice()}")
