#!/usr/bin/env python3
"""Per-kernel totals from an `ncu --csv` run of gpu__time_duration and DRAM throughput.

    ncu_summary.py RUN.csv [--rounds]
Prints one line per (kernel, grid, block): launches, total and mean us, mean DRAM %. With --rounds, only whole
rounds count: the launches from one `embed_rows` to the next; where some round picks tokens on the GPU
(`argmax_rows`), only such rounds (a server's decode rounds among its prompt rounds).
"""

import collections
import csv
import sys


def launches(path):
    """Rows of the CSV as dicts, in launch order."""
    header = None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "ID":
                header = row
            elif header is not None and len(row) == len(header):
                yield dict(zip(header, row))


def name(d):
    return d["Kernel Name"].split("(")[0]


def whole_rounds(rows):
    """The rows of complete forwards (embed_rows to the next embed_rows), of those that end in argmax_rows if any
    does; and their count."""
    rounds, current = [], None
    for d in rows:
        if name(d) == "embed_rows" and (current is None or current[-1]["ID"] != d["ID"]):
            if current is not None:
                rounds.append(current)
            current = []
        if current is not None:
            current.append(d)
    picking = [r for r in rounds if any(name(d) == "argmax_rows" for d in r)]
    picked = picking or rounds
    return [d for r in picked for d in r], len(picked)


def summarize(rows):
    kernels = collections.OrderedDict()
    for d in rows:
        key = (name(d), d.get("Grid Size", ""), d.get("Block Size", ""))
        k = kernels.setdefault(key, {"launches": 0, "ns": 0.0, "dram": []})
        value = float(d["Metric Value"].replace(",", ""))
        if d["Metric Name"].startswith("gpu__time_duration"):
            k["launches"] += 1
            k["ns"] += value
        elif d["Metric Name"].startswith("dram__throughput"):
            k["dram"].append(value)
    return kernels


def main():
    args = sys.argv[1:]
    rounds, count = "--rounds" in args, 0
    args = [a for a in args if a != "--rounds"]
    if len(args) != 1:
        raise SystemExit(__doc__)
    rows = list(launches(args[0]))
    if rounds:
        rows, count = whole_rounds(rows)
        print(f"{count} whole rounds")
    kernels = summarize(rows)
    total = 0.0
    for (name, grid, block), k in kernels.items():
        total += k["ns"]
        dram = sum(k["dram"]) / len(k["dram"]) if k["dram"] else 0.0
        mean = k["ns"] / max(k["launches"], 1) / 1000
        print(f"{name:24s} grid={grid:16s} block={block:12s} n={k['launches']:4d} "
              f"total_us={k['ns'] / 1000:9.1f} mean_us={mean:7.2f} dram%={dram:5.1f}")
    per_round = f", {total / 1000 / count:.1f} us a round" if rounds and count else ""
    print(f"total {total / 1000:.1f} us{per_round}")


if __name__ == "__main__":
    main()
