#!/usr/bin/env python3
"""Per-kernel totals from an `ncu --csv` run of gpu__time_duration and DRAM throughput.

    ncu_summary.py RUN.csv    prints one line per (kernel, grid, block): launches, total and mean us, mean DRAM %
"""

import collections
import csv
import sys


def summarize(path):
    header, kernels = None, collections.OrderedDict()
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "ID":
                header = row
                continue
            if header is None or len(row) != len(header):
                continue
            d = dict(zip(header, row))
            key = (d["Kernel Name"].split("(")[0], d.get("Grid Size", ""), d.get("Block Size", ""))
            k = kernels.setdefault(key, {"launches": 0, "ns": 0.0, "dram": []})
            value = float(d["Metric Value"].replace(",", ""))
            if d["Metric Name"].startswith("gpu__time_duration"):
                k["launches"] += 1
                k["ns"] += value
            elif d["Metric Name"].startswith("dram__throughput"):
                k["dram"].append(value)
    return kernels


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    kernels = summarize(sys.argv[1])
    total = 0.0
    for (name, grid, block), k in kernels.items():
        total += k["ns"]
        dram = sum(k["dram"]) / len(k["dram"]) if k["dram"] else 0.0
        mean = k["ns"] / max(k["launches"], 1) / 1000
        print(f"{name:24s} grid={grid:16s} block={block:12s} n={k['launches']:4d} "
              f"total_us={k['ns'] / 1000:9.1f} mean_us={mean:7.2f} dram%={dram:5.1f}")
    print(f"total {total / 1000:.1f} us")


if __name__ == "__main__":
    main()
