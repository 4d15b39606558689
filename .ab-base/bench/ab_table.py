"""The A/B runs of one `gpu_run.sh` call as a table: graph replay (and step) per setting, model and batch.

    python3 bench/ab_table.py AB_LOG [AB_LOG ...]

An ab.log holds, per run, a header `== MODEL SETTING` and then `bench/suite/gpu_engine.py speed`'s JSON
lines (the copy bandwidth, then one line per batch size). A setting run twice in a call shows
both figures, in order, so the spread within a loan is visible beside the difference.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def read_runs(text: str) -> dict[tuple[str, int], dict[str, list[tuple[float, float]]]]:
    """{(model, batch): {setting: [(replay_ms, step_ms), ...]}} in the order the log has them.
    Runs that printed no result (a crash: its traceback sits in the log) have no entry."""
    runs: dict[tuple[str, int], dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    model = setting = None
    for line in text.splitlines():
        if line.startswith("== "):
            model, _, setting = line[3:].partition(" ")
        elif line.startswith('{"model"') and model is not None:
            row = json.loads(line)
            runs[(model, int(row["batch"]))][setting].append((row["graph_replay_ms"], row["step_ms_p50"]))
    return runs


def table(runs: dict[tuple[str, int], dict[str, list[tuple[float, float]]]]) -> str:
    lines = ["| model | batch | setting | graph replay ms | step ms |", "| --- | --- | --- | --- | --- |"]
    for (model, batch), by_setting in runs.items():
        for setting, figures in by_setting.items():
            replay = " / ".join(f"{r:.3f}" for r, _ in figures)
            step = " / ".join(f"{s:.3f}" for _, s in figures)
            lines.append(f"| {model} | {batch} | {setting} | {replay} | {step} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        print(f"{path}\n{table(read_runs(Path(path).read_text()))}\n")


if __name__ == "__main__":
    main()
