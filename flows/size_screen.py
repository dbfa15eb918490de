"""Sizing and filtering one chunk of candidates as a pipeline on the in-process pool.

Run as two stages, sizing moves every candidate in lockstep rounds (``filters.sizing.size_tasks``)
and filtering starts after the last round: at each round's end and at the stage's end the
workers wait for the slowest candidate. Here each candidate moves on the moment its own probe
returns, to its next probe or to its full filter run, so the workers are fed from start to end
of the chunk. Candidates that static checks or decontamination reject are not probed at all.

The decisions are the two-stage path's: the same ``Sizer`` steps per candidate, the same
prefilters on the sized variant, the same rule that a sized variant whose code another
candidate already has stays unsized (``opsynth.verdicts.adopt_sized``: among the chunk's
candidates that size to one code, the first in chunk order keeps it, whichever finishes
first). With ``sizing.inline`` a candidate's probes run in its own filter job instead
(``filters.size_inline``), one process per candidate; its claimed size is checked and applied
here. Import this module only after ``flows.prefect_env``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsynth.config import RunConfig
from opsynth.deadline import JobLatency
from opsynth.flows.stages import (
    LazyPool,
    Progress,
    WorkLedger,
    prefilter_stage,
    prefilters,
    probe_overrides,
)
from opsynth.record import Task, Verdict
from opsynth.stage import apply_filters
from opsynth.store import RunDir, digest, read_tasks, read_verdicts, write_tasks, write_verdicts
from opsynth.verdicts import group_by_task, passed_all

if TYPE_CHECKING:
    from opsynth.filters.pool import Ticket, WorkerPool

STAGE = "size_filter"
# The stage's name with sizing off (``opsynth audit``): each task is checked as given, and its
# work files, progress and ledger lines say so.
AS_GIVEN = "screen"
# A chunk's journal of settled jobs sits beside its work file: size_filter-<key>.journal.jsonl
JOURNAL_SUFFIX = ".journal.jsonl"
# run.json's work ledger counts jobs replayed from a journal under the stage's name with this
# suffix, and jobs started ahead, on workers the previous chunk's tail left idle, with this one
JOBS_SUFFIX = "_jobs"
AHEAD_SUFFIX = "_jobs_ahead"
# Initial probes queued ahead of the workers, per worker: enough that none idles, few enough
# that a candidate's next probe or its filter run (queued behind them) starts soon, so the
# chunk ends with few long chains still running.
LOOKAHEAD_PER_WORKER = 2


@dataclass
class _Pending:
    """A submitted single-job batch and what to do with its verdicts, once."""

    ticket: Ticket
    handle: Callable[[dict[str, list[Verdict]]], None]
    key: str = ""  # the job's journal key
    replayed: bool = False  # answered from the journal: nothing ran
    settled: bool = False
    submitted_at: float = field(default_factory=time.time)


@dataclass
class _Chunk:
    """Per candidate (input order): the task it ends as and its prefilter rows; sandbox rows
    by task id (a code two candidates reach is filtered once)."""

    final: list[Task]
    pre: list[list[Verdict]]
    executed: dict[str, list[Verdict]] = field(default_factory=dict)
    done: int = 0


def stage_name(cfg: RunConfig) -> str:
    """``size_filter``, or ``screen`` where sizing is off."""
    return STAGE if cfg.sizing.enabled else AS_GIVEN


class ChunkStopped(Exception):
    """The time limit came mid-chunk: the candidates begun by then are done and in the chunk's
    journal, the rest never started; a later run resumes the chunk from there. ``left``: what
    the chunk leaves to that run (candidates not started, set-aside jobs not retried, jobs
    abandoned past the limit), which the invocation's line in run.json keeps."""

    def __init__(self, not_started: int, not_retried: int, abandoned: int) -> None:
        self.left = {
            "candidates_not_started": not_started,
            "jobs_not_retried": not_retried,
            "jobs_abandoned": abandoned,
        }
        super().__init__(
            f"{not_started} candidates not started, {not_retried} jobs not retried, "
            f"{abandoned} abandoned past the limit"
        )


def size_and_screen(
    run: RunDir,
    cfg: RunConfig,
    tasks: list[Task],
    device: str,
    pool: LazyPool,
    ledger: WorkLedger,
    progress: Progress,
    taken: set[str],
    stop_at: float | None = None,
    ahead: list[Task] | None = None,
) -> tuple[list[Task], list[Verdict]]:
    """Each task sized and filtered: the tasks as they end (sized, or as composed), in input
    order, and every prefilter and sandbox verdict for them. ``taken``: ids of the run's
    other candidates, which a sized variant may not take. One work file pair per chunk: a
    resumed run reuses a finished chunk whole. From ``stop_at`` (seconds since the epoch) less
    the pool's job latency (``pool.latency``) no candidate starts, so those begun end about
    by ``stop_at``, nor a set-aside retry, and a job still running well past it is abandoned
    (``JobLatency.abandon_at``); a chunk left unfinished then raises ``ChunkStopped`` (the
    jobs not retried or abandoned are not journaled: a later invocation runs them).
    ``ahead``: the next chunk, whose first jobs start on workers this chunk's tail leaves idle
    (``Prefetch``, kept on ``pool`` for the next call)."""
    stage = stage_name(cfg)
    tasks_path, verdicts_path = _work_paths(run, cfg, tasks, device, taken)
    if tasks_path.exists() and verdicts_path.exists():
        ledger.note(stage, True)
        progress(stage, len(tasks), len(tasks))
        return read_tasks(tasks_path), read_verdicts(verdicts_path)
    early = group_by_task(prefilter_stage(run, cfg, tasks, ledger))
    chunk = _Chunk(final=list(tasks), pre=[early.get(t.id, []) for t in tasks])
    survivors = [i for i, t in enumerate(tasks) if passed_all(t.id, early)]
    chunk.done = len(tasks) - len(survivors)
    progress(stage, chunk.done, len(tasks))
    journal = Journal(tasks_path.with_name(tasks_path.stem + JOURNAL_SUFFIX))
    prefetched, pool.prefetch = pool.prefetch, None
    if survivors:
        upcoming = Prefetch.of(run, cfg, ahead, device) if ahead else None
        pipeline = _Pipeline(
            cfg,
            device,
            pool.get(),
            chunk,
            survivors,
            taken,
            progress,
            journal,
            prefetched,
            upcoming,
            latency=pool.latency,
        )
        pipeline.stop_at = stop_at
        pipeline.run()
        if pipeline.abandoned and upcoming is not None:  # nothing of this run stays on the pool
            pool.get().cancel(list(upcoming.started.values()))
            upcoming = None
        pool.prefetch = upcoming
        for _ in range(pipeline.replayed):
            ledger.note(stage + JOBS_SUFFIX, True)
        for _ in range(pipeline.taken_over):
            ledger.note(stage + AHEAD_SUFFIX, False)
        if pipeline.backlog or pipeline.deferred or pipeline.abandoned:
            raise ChunkStopped(len(pipeline.backlog), len(pipeline.deferred), pipeline.abandoned)
    verdicts = [
        v for i, task in enumerate(chunk.final) for v in chunk.pre[i] + _executed(chunk, i, task)
    ]
    write_tasks(chunk.final, tasks_path)
    write_verdicts(verdicts, verdicts_path)  # last: its presence marks the chunk done
    journal.path.unlink(missing_ok=True)
    ledger.note(stage, False)
    return chunk.final, verdicts


class Journal:
    """A chunk's settled sandbox jobs, one JSON line each, appended (and flushed to disk) as
    each settles, so a run killed mid-chunk resumes the chunk without running them again. A
    job's verdicts depend on the job alone (its task's code and its settings, which its key
    hashes; the chunk's key covers the config and the device), not on the chunk's other
    candidates, so replaying one decides as running it would. Written and read only by the
    orchestrator; removed once the chunk's work files are written. A last line cut short by
    the kill is dropped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[str, dict[str, list[Verdict]]] = {}
        if not path.exists():
            return
        text = path.read_text()
        whole = text[: text.rfind("\n") + 1]
        if whole != text:  # a torn last line: appending after it would break the next one too
            path.write_text(whole)
        for line in whole.splitlines():
            try:
                entry = json.loads(line)
                self.done[str(entry["job"])] = {
                    str(task_id): [Verdict.from_row(row) for row in rows]
                    for task_id, rows in entry["results"].items()
                }
            except (ValueError, KeyError, TypeError, AttributeError):
                continue

    @staticmethod
    def key(job: Task, overrides: dict[str, Any] | None) -> str:
        return digest(job.id, overrides or {})

    def record(self, key: str, results: dict[str, list[Verdict]]) -> None:
        rows = {task_id: [v.to_row() for v in found] for task_id, found in results.items()}
        line = json.dumps({"job": key, "results": rows}, sort_keys=True, default=str)
        with open(self.path, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        self.done[key] = results


def finished(run: RunDir, cfg: RunConfig, tasks: list[Task], device: str, taken: set[str]) -> bool:
    """Whether this chunk's work is on disk, so ``size_and_screen`` would only read it."""
    return all(p.exists() for p in _work_paths(run, cfg, tasks, device, taken))


def _work_paths(
    run: RunDir, cfg: RunConfig, tasks: list[Task], device: str, taken: set[str]
) -> tuple[Path, Path]:
    """The chunk's final tasks and its verdicts (written last: the chunk is done)."""
    parts = (cfg.sizing, cfg.filters, cfg.decontam)
    key = digest(*[p.work_dump() for p in parts], device, [t.id for t in tasks], sorted(taken))
    stage = stage_name(cfg)
    return run.work_path(stage, key), run.work_path(f"{stage}-verdicts", key)


def inline_overrides(cfg: RunConfig, window: tuple[float, float]) -> dict[str, Any]:
    """A job that sizes its candidate in its own filter process (``filters.size_inline``)."""
    from opsynth.filters.sizing import inline_settings

    return {
        "sizing": inline_settings(cfg.sizing, window),
        "task_timeout_s": cfg.filters.task_timeout_s + cfg.sizing.inline_timeout_s,
    }


def journaled(run: RunDir) -> set[str]:
    """The keys of the jobs that settled in chunks a stop or a kill left part-done: kept in
    their journals and replayed by the next invocation, but in no exported file until their
    chunk ends."""
    keys: set[str] = set()
    for path in (run.root / "work").glob(f"*{JOURNAL_SUFFIX}"):
        keys |= set(Journal(path).done)
    return keys


class Prefetch:
    """The next chunk's first jobs, started on workers the current chunk's tail leaves idle
    and taken over by the next chunk's pipeline, which settles them as if it had submitted
    them. Each is the job that pipeline submits first for a candidate (its inline job, its
    first probe, or, without a size constant, its filter run): it depends on the candidate
    and the settings alone, not on what the current chunk decides, so starting it early
    changes no verdict. Jobs left untaken when the run stops are lost with the pool."""

    def __init__(self, jobs: list[tuple[str, Task, dict[str, Any] | None]]) -> None:
        self.waiting = deque(jobs)  # (journal key, job, overrides), in the pipeline's order
        self.started: dict[str, Ticket] = {}

    @classmethod
    def of(cls, run: RunDir, cfg: RunConfig, tasks: list[Task], device: str) -> Prefetch:
        """The first jobs of the chunk ``tasks`` (prefiltered here: that work file is the
        one its pipeline reads)."""
        from opsynth.filters.sizing import Sizer

        early = group_by_task(prefilter_stage(run, cfg, tasks, WorkLedger()))
        survivors = [t for t in tasks if passed_all(t.id, early)]
        jobs = [(Journal.key(t, None), t, None) for t in survivors]
        if cfg.sizing.enabled:
            window = cfg.filters.window_ms(device)
            sizer = Sizer(survivors, window, cfg.sizing)
            probes, finished = sizer.start()
            first = inline_overrides(cfg, window) if cfg.sizing.inline else probe_overrides(cfg)
            jobs = [(Journal.key(v, first), v, first) for v in probes]
            jobs += [(Journal.key(t, None), t, None) for t in (sizer.sized(i) for i in finished)]
        # a job an earlier, killed run journaled is replayed, not run again
        done = journaled(run)
        return cls([job for job in jobs if job[0] not in done])

    def top_up(self, pool: WorkerPool, room: int) -> None:
        """Start waiting jobs while fewer than ``room`` started ones are unfinished."""
        running = sum(not t.done for t in self.started.values())
        while self.waiting and running < room:
            key, job, overrides = self.waiting.popleft()
            if key not in self.started:
                self.started[key] = pool.submit([job], None, overrides)
                running += 1

    def take(self, key: str) -> Ticket | None:
        return self.started.pop(key, None)


def _executed(chunk: _Chunk, index: int, task: Task) -> list[Verdict]:
    """A candidate's sandbox rows: none when a prefilter rejected it."""
    return chunk.executed[task.id] if _passed(chunk.pre[index]) else []


def _violation(rows: list[Verdict], task_id: str, problem: str) -> list[Verdict]:
    """An inline job's rows as ``task_id``'s, ending in ``protocol_violation`` (``problem``;
    when empty, its last row already is one)."""
    if not problem:
        return [dataclasses.replace(v, task_id=task_id) for v in rows]
    last = rows[-1] if rows else None
    row = Verdict(
        task_id=task_id,
        stage="eager",
        passed=False,
        reason="protocol_violation",
        detail=problem[:2000],
        device=last.device if last else "",
        torch_version=last.torch_version if last else "",
    )
    return [row]


def _passed(rows: list[Verdict]) -> bool:
    """Whether a candidate's prefilter rows let it on to the sandbox."""
    return bool(rows) and all(v.passed for v in rows)


class _Pipeline:
    """Drives one chunk's probes and filter runs through the pool, one job per batch so that
    each is handled as it finishes (in the pool's progress callback). A job whose verdict the
    pool retries alone (``filters.retry_alone``) is set aside until nothing else of the chunk
    is running, and all of them are retried together (``WorkerPool.retry_alone``): each retry
    drains the whole pool, so one per job would idle it once per ``oom``."""

    def __init__(
        self,
        cfg: RunConfig,
        device: str,
        pool: WorkerPool,
        chunk: _Chunk,
        survivors: list[int],
        taken: set[str],
        progress: Progress,
        journal: Journal,
        prefetched: Prefetch | None = None,
        ahead: Prefetch | None = None,
        *,
        latency: JobLatency,
    ) -> None:
        from opsynth.filters.sized_too_fast import sized_checks
        from opsynth.filters.sizing import Sizer

        self.pool, self.chunk, self.progress = pool, chunk, progress
        self.journal, self.replayed = journal, 0
        # this chunk's first jobs started ahead; the next chunk's, to start on idle workers
        self.prefetched, self.ahead, self.taken_over = prefetched, ahead, 0
        self.stop_at: float | None = None  # the time limit: jobs started by then end by it
        self.latency = latency
        self.survivors = survivors  # sizer index -> chunk index
        self.cfg, self.window = cfg, cfg.filters.window_ms(device)
        self.stage = stage_name(cfg)
        # without sizing (an audit: its tasks are checked as given) nothing is probed
        sized = [chunk.final[i] for i in survivors] if cfg.sizing.enabled else []
        self.sizer = Sizer(sized, self.window, cfg.sizing)
        # with sizing.inline, a candidate's first job sizes it in its own filter process
        self.first_job = self._inline if cfg.sizing.inline else self._probe
        self.inline_overrides = inline_overrides(cfg, self.window)
        # the run's other candidates and this chunk's composed tasks: no sized variant's code
        self.taken = set(taken) | {t.id for t in chunk.final}
        self.claims: dict[str, int] = {}  # sized code id -> the chunk index holding it
        self.originals: dict[int, Task] = {}  # chunk index -> composed task, while sized
        self.early = list(chunk.pre)  # each composed task's prefilter rows
        self.filtering: set[str] = set()  # task ids submitted to the filters
        self.retried = set(cfg.filters.retry_alone)
        self.measure_overrides = probe_overrides(cfg)
        self.prefilters = prefilters(cfg)
        # a sized task's own checks, on its sizing record (filters.sized_too_fast)
        self.sized_checks = (
            sized_checks(cfg.sizing.too_fast_share, self.window) if cfg.sizing.enabled else []
        )
        self.queue: deque[_Pending] = deque()
        self.deferred: list[_Pending] = []  # finished with a retry_alone reason, not retried yet
        # candidates waiting for their first job (a probe, or their filtering if not sized)
        self.backlog: deque[Callable[[], None]] = deque()
        self.outstanding = 0  # submitted jobs not handled yet
        self.abandoned = 0  # jobs given up well past the time limit (``_abandon``)
        # the pool has started (LazyPool.get), so its worker count is known
        self.lookahead = LOOKAHEAD_PER_WORKER * max(1, int(pool.stats.get("workers") or 1))

    def run(self) -> None:
        probes, finished = self.sizer.start()
        if not self.cfg.sizing.enabled:
            self.backlog.extend(functools.partial(self._filter, at) for at in self.survivors)
        self.backlog.extend(functools.partial(self._sized, index) for index in finished)
        self.backlog.extend(functools.partial(self.first_job, probe) for probe in probes)
        self._feed()
        while self.queue or self.deferred:
            if not self.queue:  # nothing else of the chunk runs: retry the set-aside jobs
                if self._late():  # unless past the cutoff: a later invocation runs them anew
                    break
                self._retry_deferred()
                continue
            pending = self.queue.popleft()
            if not pending.replayed:
                until = self.latency.abandon_at(self.stop_at)
                self.pool.wait(pending.ticket, retry=False, until=until)
                if not pending.ticket.done:  # still running well past the limit
                    self.queue.appendleft(pending)
                    self._abandon()
                    break
                if self._awaits_retry(pending):
                    self.deferred.append(pending)
                    self._feed()
                    continue
            self._settle(pending)

    def _retry_deferred(self) -> None:
        """Retry the set-aside jobs alone, together (shared waves, one drain of the pool per
        wave), then settle them; settling may start their candidates' next jobs."""
        deferred, self.deferred = self.deferred, []
        self.pool.retry_alone([pending.ticket for pending in deferred])
        for pending in deferred:
            self._settle(pending)

    def _abandon(self) -> None:
        """Give up the jobs still in flight at ``JobLatency.abandon_at``: those already finished are
        journaled (a later invocation replays them), the others are withdrawn from the pool
        (their workers replaced) and run again by a later invocation."""
        waiting = [p for p in self.queue if not p.replayed and not p.settled]
        for pending in waiting:
            if pending.ticket.done and not self._awaits_retry(pending):
                self.journal.record(pending.key, pending.ticket.results)
        unfinished = [p.ticket for p in waiting if not p.ticket.done]
        self.abandoned = len(unfinished)
        self.pool.cancel(unfinished)

    def _late(self) -> bool:
        """Past the time limit less the jobs' latency: no job starts any more."""
        cutoff = self.latency.cutoff(self.stop_at)
        return cutoff is not None and time.time() >= cutoff

    def _feed(self) -> None:
        late = self._late()
        while self.backlog and self._running() < self.lookahead and not late:
            self.backlog.popleft()()
        # candidates begun finish (their later jobs are not held back); none starts late
        if not self.backlog and self.ahead is not None and not late:
            self.ahead.top_up(self.pool, self.lookahead - self._running())

    def _running(self) -> int:
        """Submitted jobs not handled yet, less the set-aside ones: those run nothing until
        their retry, so they hold no place in the lookahead."""
        return self.outstanding - len(self.deferred)

    def _submit(self, job: Task, overrides: dict[str, Any] | None, handle) -> None:
        key = Journal.key(job, overrides)
        recorded = self.journal.done.get(key)
        if recorded is not None:  # settled in its turn, like any job, without running
            from opsynth.filters.pool import Ticket

            ticket = Ticket({}, {}, results=dict(recorded))
            self.outstanding += 1
            self.replayed += 1
            self.queue.append(_Pending(ticket, handle, key, replayed=True))
            return
        holder: list[_Pending] = []
        early = self.prefetched.take(key) if self.prefetched is not None else None

        def finished(done: int, total: int) -> None:
            pending = holder[0]
            if pending.ticket.done and not self._awaits_retry(pending):
                self._settle(pending)

        if early is not None:  # started ahead, on a worker the last chunk left idle
            ticket, self.taken_over = early, self.taken_over + 1
            ticket.progress = finished  # (its verdicts, if in, are settled in queue order)
        else:
            ticket = self.pool.submit([job], finished, overrides)
        holder.append(_Pending(ticket, handle, key))
        self.outstanding += 1
        self.queue.append(holder[0])

    def _awaits_retry(self, pending: _Pending) -> bool:
        """Whether a finished job's verdict is one the pool retries alone."""
        rows = pending.ticket.results.values()
        return any(found and found[-1].reason in self.retried for found in rows)

    def _settle(self, pending: _Pending) -> None:
        if pending.settled:
            return
        pending.settled = True
        self.outstanding -= 1
        if not pending.replayed:
            self.latency.record(time.time() - pending.submitted_at)
            self.journal.record(pending.key, pending.ticket.results)
        pending.handle(pending.ticket.results)
        self._feed()

    def _probe(self, variant: Task) -> None:
        self._submit(variant, self.measure_overrides, self._measured)

    def _measured(self, results: dict[str, list[Verdict]]) -> None:
        from opsynth.filters.sizing import probe_of

        for variant_id, rows in results.items():
            following, finished = self.sizer.observe(variant_id, probe_of(rows))
            for variant in following:
                self._probe(variant)
            for index in finished:
                self._sized(index)

    def _inline(self, variant: Task) -> None:
        """One job that sizes the composed ``variant`` in its own process and filters the
        chosen size there (``filters.size_inline``)."""
        self._submit(variant, self.inline_overrides, lambda rows: self._inlined(variant, rows))

    def _inlined(self, variant: Task, results: dict[str, list[Verdict]]) -> None:
        """An inline job's rows: the chosen variant from the claim on its first row, whose rows
        they are, then placed as a probed candidate's would be. Without a claim (the process
        died first) the candidate is sized by separate probes instead, unless it broke the
        protocol: that verdict stands. A claim the search could not have made is the
        candidate's ``protocol_violation``."""
        from opsynth.filters.sizing import claimed

        rows = results[variant.id]
        claim = rows[0].measures.get("sizing") if rows and rows[0].stage == "eager" else None
        if claim is None and not (rows and rows[-1].reason == "protocol_violation"):
            self._probe(variant)
            return
        for index in self.sizer.take(variant.id):
            at = self.survivors[index]
            original = self.chunk.final[at]
            sized, problem = None, ""
            if claim is not None:
                try:
                    sized = claimed(original, claim, rows[0].device, self.window, self.cfg.sizing)
                except ValueError as bad:
                    problem = f"its sizing claim: {bad}"
            if sized is None:  # it broke the protocol: rejected as composed
                self.chunk.executed[original.id] = _violation(rows, original.id, problem)
                self._filter(at)
                continue
            if not claim.get("poisoned"):  # else its stages could not run there
                ours = [dataclasses.replace(v, task_id=sized.id) for v in rows]
                self.chunk.executed.setdefault(sized.id, ours)
            self._place(at, sized)

    def _sized(self, index: int) -> None:
        self._place(self.survivors[index], self.sizer.sized(index))

    def _place(self, at: int, sized: Task) -> None:
        """Sizing of candidate ``at`` is done: its chosen variant, unless another candidate
        holds that code (the run's others, or this chunk's earlier ones: then the later one
        goes back to its composed task), prefiltered if new and checked on its sizing record
        (``filters.sized_too_fast``), then filtered in the sandbox."""
        original = self.chunk.final[at]
        holder = self.claims.get(sized.id)
        if sized.id == original.id:
            self.chunk.final[at] = sized  # kept its size; the record says so
        elif sized.id in self.taken or (holder is not None and holder < at):
            pass  # stays as composed
        else:
            if holder is not None:  # a later candidate reached this code first: it yields
                self._keep_composed(holder)
            self.claims[sized.id] = at
            self.originals[at] = original
            self.chunk.final[at] = sized
            self.chunk.pre[at] = apply_filters([sized], self.prefilters).verdicts
        task = self.chunk.final[at]
        if self.sized_checks and "sizing" in task.meta and _passed(self.chunk.pre[at]):
            checked = apply_filters([task], self.sized_checks).verdicts
            self.chunk.pre[at] = self.chunk.pre[at] + checked
        self._filter(at)

    def _keep_composed(self, at: int) -> None:
        original = self.originals.pop(at)
        self.chunk.final[at] = original
        self.chunk.pre[at] = self.early[at]
        self._filter(at)

    def _filter(self, at: int) -> None:
        """Run candidate ``at``'s final task through the sandboxed filters, unless a prefilter
        rejected it, the same code is already on its way, or an inline job filtered it."""
        task = self.chunk.final[at]
        if not _passed(self.chunk.pre[at]):
            self._done()
        elif task.id not in self.filtering:
            self.filtering.add(task.id)
            if task.id in self.chunk.executed:
                self._done()
                return

            def filtered(results: dict[str, list[Verdict]]) -> None:
                self.chunk.executed[task.id] = results[task.id]
                self._done()

            self._submit(task, None, filtered)

    def _done(self) -> None:
        self.chunk.done += 1
        total = len(self.chunk.final)
        self.progress(self.stage, min(self.chunk.done, total), total)
