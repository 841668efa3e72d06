"""Rich rendering of training progress (stderr) and of the final summary (stdout)."""

from __future__ import annotations

import time
from typing import Any

from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from tformer.cli.console import console, err_console
from tformer.metrics import perplexity_text
from tformer.model import model_class
from tformer.training.dryrun import DryRunReport
from tformer.training.reporting import Reporter, TrainResult

_UNITS = 1000  # progress is a fraction of whichever budget (steps or time) runs out first


def loss_labels(label_smoothing: float) -> tuple[str, str]:
    """How the progress lines name their two losses: the training loss (the mean since the
    last line) is label-smoothed with --label-smoothing, the validation loss never is."""
    if label_smoothing <= 0:
        return "loss", "val loss"
    return f"loss (label-smoothed {label_smoothing:g})", "val loss (unsmoothed)"


class RichReporter(Reporter):
    """A live progress bar on a terminal; plain log lines when stderr is a file or pipe."""

    def __init__(self) -> None:
        self.live = err_console.is_terminal
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        self.total_steps: int | None = None
        self.time_budget: float | None = None
        self.val = "-"
        self.bar: TokenisingBar | None = None
        self.train_loss, self.val_loss = loss_labels(0.0)

    def tokenising(self, split: str, done: int, total: int) -> None:
        if self.bar is None:  # one line a split off a terminal, for a large corpus only
            self.bar = TokenisingBar(min_pairs=100_000).open()
        self.bar(split, done, total)

    def start(self, summary: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
        self.total_steps = summary["total_steps"]
        self.time_budget = summary["time_budget"]
        self.train_loss, self.val_loss = loss_labels(summary.get("label_smoothing", 0.0))
        model = summary["model"]
        splits = ", ".join(f"{k} {v:,}" for k, v in summary["splits"].items())
        dropped = sum(summary["dropped"].values())
        family = model_class(model.get("arch", "encoder-decoder"))
        if family.reads_source:
            layers = f"{model['n_encoder_layers']}+{model['n_decoder_layers']} layers"
            rows = f"pairs ({dropped} dropped for length)"
        else:
            stack = "decoder" if family.generates else "encoder"
            layers = f"{family.family}, {model[f'n_{stack}_layers']} layers"
            rows = f"blocks of up to {model['max_len']} tokens"
        # The vocabulary shown: the source side's, but a decoder-only model keeps the target's.
        vocab = model["tgt_vocab_size" if family.continues_prompts else "src_vocab_size"]
        err_console.print(
            f"[bold]tformer train[/] → {escape(summary['run_dir'])}  device {summary['device']}\n"
            f"model d_model {model['d_model']}, {model['n_heads']} heads, {layers}, d_ff "
            f"{model['d_ff']}, {model['norm']}-norm, vocab {vocab:,}: "
            f"{summary['parameters']:,} parameters\n"
            f"data {splits} {rows}; "
            f"{summary['batches_per_epoch']} batches/epoch, "
            f"padding {summary['padding_share']:.1%}\n"
            f"precision {summary['precision']}"
            + (", compiled" if summary.get("compile") else "")
            + f"; global batch {_global_batch(summary['global_batch'])}"
            + (f"\nresuming from step {summary['resumed_from']}" if summary["resumed_from"] else "")
        )
        if summary.get("lengths") and family.reads_source:
            err_console.print(_length_table(summary))
        if self.live:
            self.progress = Progress(
                TextColumn("[bold blue]step {task.fields[step]}"),
                BarColumn(),
                TextColumn(
                    f"{self.train_loss} {{task.fields[loss]}}  "
                    f"{self.val_loss} {{task.fields[val]}}  "
                    "lr {task.fields[lr]}  {task.fields[tps]} tok/s"
                ),
                # The run's own clock: it goes on from the saved time after --resume.
                TextColumn("{task.fields[elapsed]}  eta {task.fields[eta]}"),
                console=err_console,
            )
            self.progress.start()
            self.task = self.progress.add_task(
                "train", total=_UNITS, step=0, loss="-", val="-", lr="-", tps="-",
                elapsed=clock(summary.get("elapsed") or 0.0), eta="-",
            )

    def _fraction(self, record: dict[str, Any]) -> float:
        parts = []
        if self.total_steps:
            parts.append(record["step"] / self.total_steps)
        if self.time_budget:
            parts.append(record["elapsed"] / self.time_budget)
        return min(max(parts, default=0.0), 1.0)

    def log(self, record: dict[str, Any]) -> None:
        if "val_loss" in record:
            self.val = f"{record['val_loss']:.3f} (ppl {perplexity_text(record['val_ppl'])})"
            if "val_bleu" in record:
                self.val += f" BLEU {record['val_bleu']:.1f} chrF {record['val_chrf']:.1f}"
            if record.get("best"):
                self.val += " *"
            if self.progress is None:
                # One record a line, however narrow the console: logs are read line by line.
                err_console.print(
                    f"step {record['step']:>6}  {self.val_loss} {self.val}", soft_wrap=True
                )
            elif self.task is not None:
                self.progress.update(self.task, val=self.val)
            return
        if "loss" not in record:
            return
        fields = dict(
            step=record["step"],
            loss=f"{record['loss']:.3f}",
            lr=f"{record['lr']:.2e}",
            tps=f"{record['tokens_per_s']:,.0f}",
            elapsed=clock(record["elapsed"]),
            eta=self._eta(record),
        )
        if self.progress is not None and self.task is not None:
            self.progress.update(
                self.task, completed=self._fraction(record) * _UNITS, val=self.val, **fields
            )
        else:
            err_console.print(
                f"step {fields['step']:>6}  {self.train_loss} {fields['loss']}  lr {fields['lr']}  "
                f"{fields['tps']} tok/s  {fields['elapsed']}  eta {fields['eta']}",
                soft_wrap=True,  # one record a line, as the validation lines
            )

    def _eta(self, record: dict[str, Any]) -> str:
        """Time left: to the end of --time-budget, or of the steps at the speed so far
        (whichever comes first); "-" while neither is known."""
        left = []
        elapsed, step = float(record["elapsed"]), int(record["step"])
        if self.time_budget:
            left.append(max(self.time_budget - elapsed, 0.0))
        if self.total_steps and step > 0 and elapsed > 0:
            left.append(max(self.total_steps - step, 0) * elapsed / step)
        return clock(min(left)) if left else "-"

    def message(self, text: str) -> None:
        err_console.print(escape(text), soft_wrap=True)  # one line, as a log reader greps it

    def finish(self, result: TrainResult) -> None:
        if self.progress is not None:
            self.progress.stop()
        if result.samples:
            table = Table(title="samples", title_justify="left")
            for column in ("source", "reference", "output"):
                # An untrained model can babble for hundreds of tokens: one line each.
                table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=60)
            for sample in result.samples:
                ok = sample["output"].strip() == sample["reference"].strip()
                table.add_row(
                    escape(sample["source"]),
                    escape(sample["reference"]),
                    f"[{'green' if ok else 'red'}]{escape(sample['output'])}[/]",
                )
            err_console.print(table)
        err_console.print(
            f"trained {result.step} steps ({result.epoch:.2f} epochs) in {result.elapsed:.0f}s; "
            f"checkpoint {escape(str(result.checkpoint))}"
        )
        if result.val_loss is not None:
            err_console.print(f"validation loss {result.val_loss:.4f}")
        if result.final_pairs is not None:
            done, total = result.final_pairs
            share = "" if done == total else f" (first {done:,} of {total:,} pairs: time budget)"
            console.print(
                f"{result.exact_match_split} BLEU {result.final['bleu']:.1f} chrF "
                f"{result.final['chrf']:.1f}{share}"
            )
        if result.exact_match is not None:
            console.print(f"exact match on {result.exact_match_split}: {result.exact_match:.2%}")


def clock(seconds: float) -> str:
    """Seconds as h:mm:ss (or m:ss under an hour)."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _global_batch(batch: dict[str, int]) -> str:
    """ranks x accumulate x max_tokens: keep it equal when changing the number of processes."""
    return (
        f"{batch['ranks']} rank(s) x {batch['accumulate']} accumulated x "
        f"{batch['max_tokens']:,} tokens = {batch['tokens']:,} padded tokens per step"
    )


def _length_table(summary: dict[str, Any]) -> Table:
    """Pairs per split, token-length percentiles of each side, and pairs dropped for length."""
    table = Table(title="data (token lengths: p50 / p90 / p99 / max)", title_justify="left")
    for column in ("split", "pairs", "source", "target", "dropped"):
        table.add_column(column, justify="left" if column == "split" else "right")
    for name, lengths in summary["lengths"].items():
        table.add_row(
            name,
            f"{summary['splits'][name]:,}",
            " / ".join(map(str, lengths["source"])),
            " / ".join(map(str, lengths["target"])),
            f"{summary['dropped'][name]:,}",
        )
    return table


def show_dry_run(report: DryRunReport) -> None:
    """The dry run's measurements as a table on stdout."""
    table = Table(title="dry run (nothing was trained or written)", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    gib = 1024**3
    rows = [
        ("device / precision", f"{report.device} / {report.precision}"),
        ("parameters", f"{report.parameters:,}"),
        (
            "batch: rows x length (worst case)",
            f"{report.rows} x {report.seq_len} = {report.tokens_per_batch:,} tokens",
        ),
        ("time per step", f"{report.ms_per_step:,.1f} ms (mean of {report.steps})"),
        ("throughput", f"{report.tokens_per_s:,.0f} target tokens/s"),
        (f"peak memory ({report.memory})", f"{report.peak_bytes / gib:.2f} GiB"),
        ("before the batch (runtime, model, optimizer)", f"{report.baseline_bytes / gib:.2f} GiB"),
    ]
    if report.free_bytes is not None:
        rows.append(("free memory", f"{report.free_bytes / gib:.2f} GiB"))
    if report.max_tokens_fit is not None:
        verdict = "fits" if report.max_tokens_fit >= report.max_tokens else "does NOT fit"
        rows.append(("--max-tokens", f"{report.max_tokens:,} ({verdict})"))
        rows.append(("largest --max-tokens (estimate)", f"{report.max_tokens_fit:,}"))
    cache = f"{report.kv_cache_bytes_per_token:,} bytes"
    if report.kv_heads != report.n_heads:
        cache += f" ({report.kv_heads}/{report.n_heads} of multi-head)"
    rows.append(("decoding KV cache per token (float32)", cache))
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)


class TokenisingBar:
    """A Rich bar per split (pairs, pairs/s, time left) on a terminal; else one line a split
    of at least ``min_pairs`` pairs once it is done. A stream's total is unknown (0)."""

    def __init__(self, min_pairs: int = 0) -> None:
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}
        self.seen: dict[str, tuple[int, float, float]] = {}  # split -> (done, started, now)
        self.printed: set[str] = set()
        self.min_pairs = min_pairs

    def __enter__(self) -> TokenisingBar:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> TokenisingBar:
        if err_console.is_terminal and self.progress is None:
            self.progress = Progress(
                TextColumn("[bold blue]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("pairs, {task.fields[rate]:,.0f}/s"),
                TimeRemainingColumn(),
                console=err_console,
            )
            self.progress.start()
        return self

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        for split in self.seen:
            self._print(split)

    def __call__(self, split: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if split not in self.seen:
            for earlier in self.seen:
                self._print(earlier)
            self.seen[split] = (0, now, now)
            if self.progress is not None:
                self.tasks[split] = self.progress.add_task(split, total=total or None, rate=0.0)
        started = self.seen[split][1]
        self.seen[split] = (done, started, now)
        if self.progress is not None:
            rate = done / max(now - started, 1e-9)
            self.progress.update(self.tasks[split], completed=done, rate=rate)

    def _print(self, split: str) -> None:
        done, started, now = self.seen[split]
        if self.tasks or split in self.printed or done < self.min_pairs:
            return  # a live bar showed it, or it is small
        self.printed.add(split)
        rate = done / max(now - started, 1e-9)
        err_console.print(f"{split}: {done:,} pairs tokenised ({rate:,.0f} pairs/s)")
