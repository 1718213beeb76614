"""The dashboard's state: param classes over run stores, usable and testable without a browser.

- `RunState`       one run directory: its step summaries as a DataFrame (grown as a `StoreFollower` reports
                   new complete steps), weight versions, syncs, applied toggles, pending toggle requests,
                   per-record divergence, and each op's current kernel path. A run that does not exist yet
                   (the lab starts the dashboard before its runs) is followed until it appears.
- `DashboardState` several runs overlaid (e.g. strict and native) plus the drill-down selection:
                   run -> step -> sample (record) -> token, the step's per-token divergence heatmap data and
                   its first divergence (layer, op); and the toggle requests, checked against the token the
                   dashboard requires.

Views (dashboards/views.py) only read these objects and call `poll()`, `select_*()` and `request_toggle()`.

    state = DashboardState.from_run_dirs(["runs/lab/strict", "runs/lab/native"])
    state.poll()                              # new steps of every run (call it periodically)
    state.step = 3; state.record_id           # the sample with the most mismatching tokens of step 3
    state.heatmap.z.shape                     # (samples, positions)
    state.request_toggle("strict", "attention", "native")   # the run applies it at its next step boundary
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import param

from rlkit.contract import OPS, PATHS
from rlkit.timeline.records import StepSummary, SyncEvent, ToggleEvent, WeightVersion
from rlkit.timeline.lock import holder
from rlkit.timeline.store import DB_NAME, RunStore, StoreError, StoreFollower
from rlkit.timeline.timeline import Timeline, mismatches

from .access import check_token

METRICS = {
    "mismatch_count": "mismatching tokens",
    "max_abs_diff": "max |trainer − rollout|",
    "k3_kl": "K3 KL(rollout ‖ trainer)",
    "ratio_spread": "importance ratio: max − min",
    "reward_mean": "mean reward",
    "heldout_reward": "held-out reward",
}
"""The per-step charts, in order: StepSummary field (ratio_spread = ratio_max - ratio_min) -> title. The
held-out reward exists only on the steps that measured it (`RunConfig.heldout_every`); the others are
gaps, which its chart draws over."""

STEP_COLUMNS = (["step", "weight_version", "compared_tokens", "mismatch_count", "max_abs_diff", "mean_abs_diff",
                 "k3_kl", "ratio_min", "ratio_mean", "ratio_max", "ratio_spread", "ratio_outside", "reward_mean",
                 "reward_std", "heldout_reward", "loss", "clip_fraction", "valid", "n_native"]
                + [f"path.{op}" for op in OPS])
RECORD_COLUMNS = ["record_id", "step", "prompt_id", "sample_index", "engine_id", "weight_version",
                  "recompute_version", "reward", "finish_reason", "n_tokens", "mismatch_count", "max_abs_diff"]

EQUAL_Z = -10.0
"""Heatmap value of a token whose rollout and trainer logprobs agree bit for bit. Mismatching tokens get
log10|trainer - rollout| clipped to [MIN_Z, MAX_Z] (a signed-zero mismatch, diff 0, gets MIN_Z; a non-finite
diff MAX_Z), so 'equal' and 'differs by 1e-9' are never the same colour."""
MIN_Z, MAX_Z = -9.0, 2.0


def run_labels(run_dirs) -> dict[str, Path]:
    """A short, unique label per run directory: its name, or parent/name when names repeat."""
    paths = [Path(d) for d in run_dirs]
    names = [p.name or str(p) for p in paths]
    labels = {}
    for p, name in zip(paths, names):
        label = name if names.count(name) == 1 else f"{p.parent.name}/{name}"
        while label in labels:
            label += "'"
        labels[label] = p
    return labels


def describe_progress(progress: dict) -> str:
    """'warm start 37 of 100 steps, loss 2.31, about 1 min 20 s left' from a run's progress info."""
    step, total = int(progress.get("step", 0)), int(progress.get("total", 0))
    text = f"{progress.get('phase', 'warm start')} {step} of {total} steps"
    loss, eta = progress.get("loss"), progress.get("eta_s")
    if isinstance(loss, (int, float)):
        text += f", loss {loss:.3g}"
    if isinstance(eta, (int, float)) and eta == eta and step < total:
        minutes, seconds = divmod(int(round(eta)), 60)
        text += f", about {f'{minutes} min ' if minutes else ''}{seconds} s left"
    return text


def initial_paths(config: dict) -> dict[str, str]:
    """Each op's path before step 0, from a stored RunConfig dict (path, then per-op overrides); reads the
    dict directly so the dashboard never imports torch."""
    base = config.get("path", "strict")
    base = base if base in PATHS else "strict"
    ops = config.get("ops") or {}
    return {op: ops.get(op, base) for op in OPS}


class RunState(param.Parameterized):
    """One run, followed as it writes (or replayed when it is finished)."""

    run_dir = param.String(constant=True, doc="The run directory (it may not exist yet).")
    label = param.String(constant=True, doc="Short name shown in legends and controls.")
    exists = param.Boolean(False, doc="The run's store exists (created by the run).")
    config = param.Dict(default={}, doc="The RunConfig the run was started with.")
    steps = param.DataFrame(doc="One row per complete step (STEP_COLUMNS).")
    records = param.DataFrame(doc="One row per rollout record (RECORD_COLUMNS), with its divergence.")
    versions = param.DataFrame(doc="Weight versions: version, step, checksum, fingerprint, created_at.")
    syncs = param.DataFrame(doc="Syncs: engine, version, checksums sent/acknowledged, times, ok.")
    toggles = param.DataFrame(doc="ToggleEvents the run applied (step = first step with the new path).")
    pending = param.DataFrame(doc="Toggle requests the run has not applied yet.")
    paths = param.Dict(default={}, doc="Each op's path in the newest step (or before step 0).")
    progress = param.Dict(default=None, allow_None=True,
                          doc="What the run does before its first step (the warm start's step, total, loss, "
                              "eta_s), as the run last reported it; None once steps arrive.")
    source = param.Dict(default=None, allow_None=True,
                        doc="For a run imported from another framework's dump: its format, layout and what "
                            "it did not record (the store's 'import' info); None for rlkit's own runs.")
    run_state = param.Dict(default=None, allow_None=True,
                           doc="What the writer last said of itself (the store's 'run_state': running, "
                               "finished, stopped or failed, with the reason); None for stores written "
                               "before runs said it.")
    writer_alive = param.Boolean(False, doc="A process holds the run's writer lock (checked while the run "
                                            "is not known to have ended).")
    revision = param.Integer(0, doc="Incremented whenever any of the above changes.")

    def __init__(self, run_dir, label: str | None = None, **params):
        run_dir = Path(run_dir)
        super().__init__(run_dir=str(run_dir), label=label or run_dir.name, **params)
        self._follower = StoreFollower(run_dir, missing_ok=True)
        self._timeline: Timeline | None = None
        self._summaries: dict[int, StepSummary] = {}
        self.steps = pd.DataFrame(columns=STEP_COLUMNS)
        self.records = pd.DataFrame(columns=RECORD_COLUMNS)
        for name, columns in EMPTY_COLUMNS.items():
            setattr(self, name, pd.DataFrame(columns=columns))

    # -- reading ----------------------------------------------------------------------------------
    @property
    def timeline(self) -> Timeline | None:
        """The pandas view of the run (None until the run exists)."""
        return self._timeline

    @property
    def planned_steps(self) -> int:
        return int(self.config.get("steps", 0) or 0)

    @property
    def n_steps(self) -> int:
        return len(self._summaries)

    @property
    def last_step(self) -> int | None:
        return max(self._summaries) if self._summaries else None

    @property
    def finished(self) -> bool:
        """Every planned step is in the store: the run is replayed, toggles have nothing to act on."""
        return bool(self.planned_steps) and self.n_steps >= self.planned_steps

    def summary(self, step: int) -> StepSummary | None:
        return self._summaries.get(step)

    def default_step(self) -> int | None:
        """The step a drill-down opens on: of the steps whose per-token data the store holds (a copy
        brought back from a GPU may keep it for every k-th step only), the one with the most mismatching
        tokens, the latest of equals; the latest step when none has per-token data."""
        with_records = set(self.records["step"].tolist()) if len(self.records) else set()
        candidates = [s for s in self._summaries if s in with_records]
        if not candidates:
            return self.last_step
        return max(candidates, key=lambda s: (self._summaries[s].mismatch_count, s))

    def _mode(self) -> str:
        """finished / stopped / failed (with the reason the run stored) / live / not running."""
        done, planned = self.n_steps, self.planned_steps
        state = self.run_state or {}
        if self.finished:
            return "finished"
        if state.get("state") in ("stopped", "failed", "finished"):
            return f"{state['state']} after {done} of {planned} steps: {state.get('reason', 'no reason stored')}"
        if self.writer_alive:
            return f"{done} of {planned} steps so far"
        if state.get("state") == "running":
            return (f"not running: {done} of {planned} steps; its writer (pid {state.get('pid', '?')}) ended "
                    f"without saying why (killed?)")
        return f"not running: {done} of {planned} steps; the store does not say why it stopped"

    def status(self) -> str:
        if not self.exists:
            return f"{self.label}: waiting for the run to start ({self.run_dir})"
        span = f"steps {min(self._summaries)}–{self.last_step}" if self._summaries else "no step yet"
        if not self._summaries and self.progress:
            span += f" — {describe_progress(self.progress)}"
        mode = self._mode()
        pending = f", {len(self.pending)} toggle request(s) pending" if len(self.pending) else ""
        origin = ""
        if self.source:  # an imported run says where it came from and what its source did not record
            origin = (f" — imported from {self.source.get('format')}; not recorded: "
                      f"{', '.join(self.source.get('not_recorded') or ['nothing'])}")
        return f"{self.label}: {span} ({mode}){pending}{origin}"

    def poll(self) -> list[int]:
        """Read what the run committed since the last poll; returns the steps that arrived."""
        new = self._follower.poll()
        changed = False
        if self._timeline is None and self._follower.store is not None:
            self._timeline = Timeline(self.run_dir)
            self.config = self._timeline.config()
            self.source = self._timeline.source()
            self.exists = True
            self.paths = initial_paths(self.config)
            changed = True
        if self._timeline is None:
            return []
        state = self._follower.store.info("run_state")
        if state != self.run_state:
            self.run_state = state
            changed = True
        if not self.finished and (state is None or state.get("state") == "running"):
            alive = holder(self.run_dir) is not None
            if alive != self.writer_alive:
                self.writer_alive = alive
                changed = True
        elif self.writer_alive:
            self.writer_alive = False
            changed = True
        if not self._summaries and not new:  # before step 0: the warm start reports its progress
            progress = self._follower.store.info("progress")
            if progress != self.progress:
                self.progress = progress
                changed = True
        if new:
            self.progress = None
            redone = {s.step for s in new} & set(self._summaries)
            for s in new:
                self._summaries[s.step] = s
            rows = pd.DataFrame([_step_row(s) for s in new], columns=STEP_COLUMNS)
            old_steps, old_records = self.steps, self.records
            if redone:  # a resumed run redid these steps: drop their old rows
                old_steps = old_steps[~old_steps["step"].isin(redone)]
                old_records = old_records[~old_records["step"].isin(redone)]
            self.steps = _concat(STEP_COLUMNS, old_steps, rows).sort_values("step", ignore_index=True)
            self.records = _concat(RECORD_COLUMNS, old_records, *[self._timeline.records(s.step) for s in new])
            self.paths = dict(self._summaries[max(self._summaries)].ops_paths)
            self.versions = self._timeline.versions()
            self.syncs = self._timeline.syncs()
            self.toggles = self._timeline.toggles()
            changed = True
        pending = self._timeline.pending_toggles()
        if not pending["request_id"].equals(self.pending["request_id"]):
            self.pending = pending
            changed = True
        if changed:
            self.revision += 1
        return [s.step for s in new]

    def pending_path(self, op: str) -> str | None:
        """The path the newest pending request asks for `op`, if any."""
        rows = self.pending[self.pending["op"] == op]
        return None if rows.empty else str(rows.iloc[-1]["path"])

    def first_divergences(self) -> pd.DataFrame:
        """One row per step whose summary holds a first divergence (the locator ran and found one)."""
        rows = [dict(step=s.step, **{k: s.first_divergence.get(k) for k in
                                     ("layer", "op", "site", "differing_rows", "compared_rows", "max_abs_diff")})
                for s in sorted(self._summaries.values(), key=lambda s: s.step) if s.first_divergence]
        return pd.DataFrame(rows, columns=["step", "layer", "op", "site", "differing_rows", "compared_rows",
                                           "max_abs_diff"])

    # -- writing ----------------------------------------------------------------------------------
    def request_toggle(self, op: str, path: str, source: str = "dashboard") -> int:
        """Write a toggle request into the run's store; the run applies it at its next step boundary."""
        if not self.exists:
            raise StoreError(f"{self.label}: the run has not started yet ({self.run_dir})")
        if self.finished:
            raise StoreError(f"{self.label}: the run is finished ({self.n_steps} of {self.planned_steps} steps); "
                             f"a toggle would never be applied")
        request_id = request_toggle_in(self.run_dir, op, path, source)
        self.pending = self._timeline.pending_toggles()
        self.revision += 1
        return request_id

    def close(self) -> None:
        self._follower.close()
        if self._timeline is not None:
            self._timeline.close()


class RunNotToggleable(StoreError):
    """A toggle request for a run that has not started or has finished: nothing would ever apply it."""


def request_toggle_in(run_dir, op: str, path: str, source: str) -> int:
    """Open the run's store for writing just long enough to add one toggle request (the run itself holds
    the other writer connection; SQLite queues the two). A run that has not started, or has committed every
    planned step, is refused with RunNotToggleable."""
    if not (Path(run_dir) / DB_NAME).is_file():
        raise RunNotToggleable(f"{run_dir}: the run has not started yet; a toggle would have no run to apply it")
    store = RunStore.open(run_dir)
    try:
        planned, last = store.config().get("steps"), store.last_step()
        if isinstance(planned, int) and last is not None and last + 1 >= planned:
            raise RunNotToggleable(f"{run_dir}: the run is finished ({last + 1} of {planned} steps); a toggle "
                                   f"would never be applied")
        return store.request_toggle(op, path, source)
    finally:
        store.close()


def _fields(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# The columns the Timeline frames have, so an empty run's frames can be filtered like a full one's.
EMPTY_COLUMNS = {"versions": _fields(WeightVersion), "syncs": _fields(SyncEvent) + ["ok", "duration"],
                 "toggles": _fields(ToggleEvent), "pending": ["request_id", "op", "path", "requested_at", "source"]}


def _concat(columns: list[str], *frames: pd.DataFrame) -> pd.DataFrame:
    # pandas warns about (and mis-types) concatenations with empty frames: leave them out
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=columns)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0].reset_index(drop=True)


def _step_row(s: StepSummary) -> dict:
    row = {k: getattr(s, k) for k in STEP_COLUMNS if hasattr(s, k)}
    row["ratio_spread"] = s.ratio_max - s.ratio_min
    row["n_native"] = sum(1 for p in s.ops_paths.values() if p == "native")
    row.update({f"path.{op}": s.ops_paths.get(op, "") for op in OPS})
    return row


# -- the per-token heatmap ---------------------------------------------------------------------------
class TokenText:
    """Token id -> readable text for hovers, with the Qwen3 tokenizer loaded on first use (it imports
    transformers and torch, seconds); without the tokenizer (no data folder) it shows the id."""

    def __init__(self, decode: Callable[[int], str] | None = None):
        self._decode = decode
        self._cache: dict[int, str] = {}
        self.available = True

    def __call__(self, token_id: int) -> str:
        token_id = int(token_id)
        if token_id not in self._cache:
            self._cache[token_id] = self._text(token_id)
        return self._cache[token_id]

    def _text(self, token_id: int) -> str:
        if self._decode is None and self.available:
            try:
                from rlkit.model.tokenizer import load_tokenizer

                tok = load_tokenizer()
                self._decode = lambda i: tok.decode([i], skip_special_tokens=False)
            except (FileNotFoundError, OSError, ImportError):
                self.available = False
        if self._decode is None:
            return f"<id {token_id}>"
        return self._decode(token_id)


@dataclasses.dataclass
class HeatmapData:
    """Samples x positions of one step: what the heatmap draws and its hovers show. Rows follow the
    step's record order; positions past a record's end are NaN (z, logprobs) and -1 (token ids)."""

    step: int
    record_ids: list[str]
    labels: list[str]
    z: np.ndarray
    mismatch: np.ndarray
    rollout: np.ndarray
    trainer: np.ndarray
    diff: np.ndarray
    token_ids: np.ndarray
    hover: list[list[str]]
    note: str = ""
    """Why the step has no rows, when it has none (e.g. a copy of a run that kept per-token data of
    every k-th step only)."""

    @property
    def shape(self) -> tuple[int, int]:
        return self.z.shape

    def row(self, record_id: str) -> int:
        return self.record_ids.index(record_id)


def diff_z(rollout: np.ndarray, trainer: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(z, mismatch, diff) of one record's tokens: EQUAL_Z where the two fp32 logprobs agree bit for bit,
    log10|trainer - rollout| (clipped) where they do not."""
    with np.errstate(invalid="ignore", divide="ignore"):
        diff = trainer.astype(np.float64) - rollout.astype(np.float64)
        mism = mismatches(rollout, trainer)
        mag = np.abs(diff)
        z = np.where(np.isfinite(mag), np.log10(np.where(mag > 0, mag, 10.0 ** MIN_Z)), MAX_Z)
    z = np.clip(z, MIN_Z, MAX_Z)
    return np.where(mism, z, EQUAL_Z), mism, diff


def _fmt(x: float) -> str:
    # fp32 values: numpy prints the shortest decimal that reads back to the same fp32 bits
    return "—" if math.isnan(x) else str(np.float32(x))


def build_heatmap(store: RunStore, step: int, text: TokenText) -> HeatmapData:
    """The step's records against their (latest) trainer recompute, token by token."""
    records = store.records(step)
    latest = {r.record_id: r for r in store.recomputes(step)}
    width = max([r.n_tokens for r in records] + [1])
    n = len(records)
    z = np.full((n, width), np.nan)
    rollout, trainer, diff = (np.full((n, width), np.nan) for _ in range(3))
    mism = np.zeros((n, width), dtype=bool)
    ids = np.full((n, width), -1, dtype=np.int64)
    labels, hover = [], []
    for i, rec in enumerate(records):
        k = rec.n_tokens
        a = rec.logprobs_array()
        rc = latest.get(rec.record_id)
        b = rc.logprobs_array() if rc is not None else np.full_like(a, np.nan)
        zi, mi, di = diff_z(a, b)
        if rc is None:  # nothing to compare: no colour, no mismatch
            zi, mi = np.full(k, np.nan), np.zeros(k, dtype=bool)
        z[i, :k], mism[i, :k], diff[i, :k] = zi, mi, di
        rollout[i, :k], trainer[i, :k], ids[i, :k] = a, b, rec.token_ids
        labels.append(f"{rec.prompt_id} #{rec.sample_index} ({int(mi.sum())}/{k})")
        row = []
        for j in range(width):
            if j >= k:
                row.append("")
                continue
            verdict = "bitwise equal" if not mi[j] else f"differs by {di[j]:.3g}"
            row.append(f"{rec.record_id} · position {j}<br>token {text(rec.token_ids[j])!r} (id {rec.token_ids[j]})"
                       f"<br>rollout logprob {_fmt(a[j])}<br>trainer logprob {_fmt(b[j])}<br>{verdict}")
        hover.append(row)
    note = ""
    if not records:
        every = store.token_steps_every()
        note = ("no per-token records for this step" +
                (f" (this copy of the run keeps those of one step in {every})" if every > 1 else ""))
    return HeatmapData(step, [r.record_id for r in records], labels, z, mism, rollout, trainer, diff, ids, hover,
                       note)


# -- several runs and the drill-down -----------------------------------------------------------------
class DashboardState(param.Parameterized):
    """Runs overlaid, the drill-down selection and the toggle requests of one dashboard session."""

    runs = param.List(item_type=RunState, constant=True, doc="The runs shown, in order.")
    run = param.Selector(objects=[], doc="Label of the run the drill-down and the timeline show.")
    step = param.Integer(None, allow_None=True, doc="The step drilled into (None: no step yet).")
    follow_latest = param.Boolean(True, doc="Move `step` to each new step of the run as it arrives.")
    record_id = param.Selector(objects=[], allow_None=True, doc="The sample (rollout record) drilled into.")
    position = param.Integer(None, allow_None=True, doc="The token position drilled into.")
    step_records = param.DataFrame(doc="The records of the chosen step, with their divergence.")
    heatmap = param.ClassSelector(class_=HeatmapData, allow_None=True, doc="Samples x positions of the step.")
    tokens = param.DataFrame(doc="Per token of the chosen sample: text, both logprobs, diff, mismatch.")
    first_divergence = param.Dict(None, allow_None=True, doc="(layer, op, ...) of the chosen step, if located.")
    required_token = param.String(None, allow_None=True, precedence=-1,
                                  doc="The token the dashboard was started with (None: loopback, no token).")
    session_token = param.String(None, allow_None=True, precedence=-1,
                                 doc="The token this session presented (from the page URL).")
    message = param.String("", doc="The outcome of the last action, for the status line.")
    revision = param.Integer(0, doc="Incremented when any run got new data.")

    def __init__(self, runs: list[RunState], token_text: TokenText | None = None, **params):
        super().__init__(runs=list(runs), **params)
        if not self.runs:
            raise ValueError("a dashboard needs at least one run directory")
        self._text = token_text or TokenText()
        labels = [r.label for r in self.runs]
        self.param.run.objects = labels
        if self.run is None:
            self.run = labels[0]

    @classmethod
    def from_run_dirs(cls, run_dirs, **params) -> "DashboardState":
        state = cls([RunState(path, label) for label, path in run_labels(run_dirs).items()], **params)
        state.poll()
        return state

    def get(self, label: str | None = None) -> RunState:
        label = label or self.run
        for r in self.runs:
            if r.label == label:
                return r
        raise KeyError(f"no run {label!r}; runs: {', '.join(r.label for r in self.runs)}")

    @property
    def current(self) -> RunState:
        return self.get()

    # -- following ------------------------------------------------------------------------------
    def poll(self) -> dict[str, list[int]]:
        """Poll every run; returns the new steps per run label (only runs that got some)."""
        before = [r.revision for r in self.runs]
        new = {r.label: r.poll() for r in self.runs}
        if [r.revision for r in self.runs] != before:
            self.revision += 1
        run = self.current
        if run.last_step is not None:
            if self.step is None:
                self.step = self._opening_step(run)
            elif self.follow_latest and new.get(run.label):
                self.step = run.last_step
        return {k: v for k, v in new.items() if v}

    def _opening_step(self, run: RunState) -> int | None:
        """A live run followed: its newest step; a run that is not running: `RunState.default_step`."""
        return run.last_step if self.follow_latest and run.writer_alive else run.default_step()

    # -- drill-down -----------------------------------------------------------------------------
    @param.depends("run", watch=True)
    def _run_changed(self) -> None:
        run = self.current
        if self.step is not None and run.summary(self.step) is not None:
            self._load_step()  # same step number, other run
        else:
            self.step = self._opening_step(run)

    @param.depends("step", watch=True)
    def _load_step(self) -> None:
        run, step = self.current, self.step
        summary = run.summary(step) if step is not None else None
        if summary is None:
            self.step_records = pd.DataFrame(columns=RECORD_COLUMNS)
            self.heatmap, self.first_divergence = None, None
            self.param.record_id.objects = []
            self.record_id = None
            return
        recs = run.records[run.records["step"] == step].reset_index(drop=True)
        self.step_records = recs
        self.first_divergence = summary.first_divergence
        self.heatmap = build_heatmap(run.timeline.store, step, self._text)
        ids = list(recs["record_id"])
        self.param.record_id.objects = ids
        if self.record_id in ids:
            self._load_tokens()
        else:  # the sample with the most mismatching tokens is the interesting one
            counts = recs["mismatch_count"].fillna(0).astype(int)
            self.record_id = ids[int(counts.values.argmax())] if ids else None

    @param.depends("record_id", watch=True)
    def _load_tokens(self) -> None:
        if self.record_id is None or self.step is None:
            self.tokens = pd.DataFrame(columns=["position", "token", "token_id", "rollout_lp", "trainer_lp",
                                                "diff", "mismatch"])
            self.position = None
            return
        df = self.current.timeline.tokens(self.step, self.record_id)
        df.insert(1, "token", [self._text(t) for t in df["token_id"]])
        self.tokens = df
        if self.position is not None and self.position >= len(df):
            self.position = None

    def select_step(self, step: int, run: str | None = None) -> None:
        """Drill into `step` of `run` (default: the current run); stops following the newest step."""
        target = self.get(run)
        if target.summary(step) is None:
            raise KeyError(f"{target.label} has no complete step {step}")
        self.follow_latest = False
        with param.parameterized.batch_call_watchers(self):
            if run is not None and run != self.run:
                self.run = run
        self.step = step

    def select_cell(self, row: int, position: int) -> None:
        """A click on the heatmap: sample `row` of the step, token `position`."""
        hm = self.heatmap
        if hm is None or not (0 <= row < len(hm.record_ids)):
            return
        self.record_id = hm.record_ids[row]
        self.position = position if 0 <= position < hm.shape[1] and hm.token_ids[row, position] >= 0 else None

    # -- toggles --------------------------------------------------------------------------------
    def can_control(self) -> bool:
        """This session may send toggle requests (no token required, or it presented the right one)."""
        try:
            check_token(self.required_token, self.session_token)
            return True
        except PermissionError:
            return False

    def request_toggle(self, run: str, op: str, path: str, source: str = "dashboard") -> int:
        """Ask `run` to switch `op` to `path` at its next step boundary. Checks this session's token first
        (TokenRefused, nothing written); StoreError when the run cannot take requests (not started,
        finished)."""
        check_token(self.required_token, self.session_token, "toggle request")
        target = self.get(run)
        try:
            request_id = target.request_toggle(op, path, source)
        except StoreError as e:
            self.message = str(e)
            raise
        when = time.strftime("%H:%M:%S")
        self.message = (f"{when} asked {target.label} to run {op} on the {path} path (request #{request_id}); "
                        f"it applies at the run's next step boundary")
        self.revision += 1
        return request_id

    def close(self) -> None:
        for r in self.runs:
            r.close()
