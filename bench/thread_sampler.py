"""A sampling profile of every thread of this process, for benches (standard library only).

cProfile sees only the thread it runs in; the power sync's time is spent in
worker threads (pyghmi, sushy) and pyghmi's I/O thread as much as on the event
loop. This samples every thread's stack every ``interval`` seconds and counts,
per thread group (the name without its number), the innermost frames: where
the threads are when they hold (or wait for) the GIL.
"""

from __future__ import annotations

import collections
import re
import sys
import threading
import time


class ThreadSampler:
    def __init__(self, interval: float = 0.005) -> None:
        self.interval = interval
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="thread-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.is_set():
            names = {t.ident: re.sub(r"[-_]?\d+(_\d+)?$", "", t.name) for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                code = frame.f_code
                where = f"{code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {code.co_name}"
                self.counts[(names.get(ident, "?"), where)] += 1
            self.samples += 1
            time.sleep(self.interval)

    def report(self, top: int) -> str:
        lines = [f"thread samples ({self.samples} rounds every {self.interval * 1000:g} ms): group, innermost frame"]
        for (group, where), count in self.counts.most_common(top):
            lines.append(f"{count / max(1, self.samples):8.2f}  {group:<28} {where}")
        return "\n".join(lines)
