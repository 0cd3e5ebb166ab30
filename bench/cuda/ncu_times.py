#!/usr/bin/env python3
"""Kernel durations from an `ncu --metrics gpu__time_duration.sum --csv` log (run_decode_profile.sh).

  ncu_times.py LOG          one line per launch, in order (us)
  ncu_times.py LOG --sum    summed per kernel name, largest first (ms, count, mean us)
"""
import collections
import csv
import re
import sys

UNIT_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def launches(path):
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    h = rows[0]
    ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
    for r in rows[1:]:
        # "void ns::<unnamed>::kernel<args>(Params)" -> "kernel<args>"
        name = re.sub(r"\(.*", "", r[ki]).replace("void ", "")
        name = re.sub(r"^.*::(?=[^:<]+(<|$))", "", name)[:70]
        yield name, float(r[vi].replace(",", "")) * UNIT_US.get(r[ui], 1e-3)


def main():
    path, summed = sys.argv[1], "--sum" in sys.argv[2:]
    if not summed:
        for name, us in launches(path):
            print(f"  {us:8.2f} us  {name}")
        return
    tot, cnt = collections.defaultdict(float), collections.Counter()
    for name, us in launches(path):
        tot[name] += us
        cnt[name] += 1
    print(f"  kernels {sum(cnt.values())}, sum of durations {sum(tot.values()) / 1000:.3f} ms")
    for k, v in sorted(tot.items(), key=lambda x: -x[1])[:16]:
        print(f"  {v / 1000:8.3f} ms {cnt[k]:5d}x {v / cnt[k]:8.2f} us  {k}")


if __name__ == "__main__":
    main()
