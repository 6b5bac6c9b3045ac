"""The threads every stream's tiering shares (a node holds thousands of streams).

* ``events``: a serial pool; each tierer is one lane that runs its state machine
  whenever it has events (committed chunks, upload outcomes, timer ticks), so an idle
  stream holds no thread.
* ``uploads``: fragment uploads, manifest commits and retention passes of every stream.
  The state machine bounds a stream's uploads in flight (``tier.max_uploads``), so a
  busy stream holds at most that many of the pool's threads.
* ``reads``: concurrent fragment metadata reads while resolving.
* ``timer``: age cuts, debounce and retry deadlines and retention passes of every
  stream on one thread.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tierlog.concurrency import SerialPool, SharedTimer
from tierlog.logs import get_logger

log = get_logger(__name__)

DEFAULT_EVENT_THREADS = 2
DEFAULT_UPLOAD_THREADS = 8
DEFAULT_RESOLUTION_READS = 8


@dataclass(frozen=True, slots=True)
class RuntimeSizes:
    event_threads: int = DEFAULT_EVENT_THREADS
    upload_threads: int = DEFAULT_UPLOAD_THREADS
    resolution_reads: int = DEFAULT_RESOLUTION_READS


class TieringRuntime:
    def __init__(self, sizes: RuntimeSizes | None = None) -> None:
        sizes = sizes or RuntimeSizes()
        self.sizes = sizes
        self.events = SerialPool(sizes.event_threads, "tier-events")
        self.uploads = ThreadPoolExecutor(sizes.upload_threads, thread_name_prefix="tier-upload")
        self.reads = ThreadPoolExecutor(sizes.resolution_reads, thread_name_prefix="tier-resolve")
        self.timer = SharedTimer("tier-timer", _timer_failed)

    def shutdown(self) -> None:
        self.timer.shutdown()
        self.events.shutdown(wait=True)
        self.uploads.shutdown(wait=True, cancel_futures=True)
        self.reads.shutdown(wait=True, cancel_futures=True)


def _timer_failed(exc: BaseException) -> None:
    log.error("tiering_timer_failed", error=repr(exc))


_default: TieringRuntime | None = None
_default_lock = threading.Lock()


def default_runtime() -> TieringRuntime:
    """The process-wide runtime of tierers that were not given one."""
    global _default
    with _default_lock:
        if _default is None:
            _default = TieringRuntime()
        return _default
