# A hostile trial's script (2026-12-06g), kept as it ran.
# ruff: noqa: B023, E402, E501, SIM115, UP031
# Independent truth for the simulated card (docs/configuration.md: 200 W one window, 200 n^0.6
# for n, cap 700 W, 60 W floor), from client-side window times; read every 0.1 s as the
# in-process reader does (mean windows over the read interval).
import json
import math
import sys

res = json.load(open(sys.argv[1]))
IDLE, WW, CAP, DT = 60.0, 200.0, 700.0, 0.1


def ww(m):
    if m <= 0:
        return 0.0
    return min(WW * m if m <= 1 else WW * m**0.6, CAP - IDLE)


wins = [(r["t0"], r["t1"]) for r in res]
# also the warm-up was excluded: fine (1.5 s before)
T0 = min(a for a, _ in wins) - 1
T1 = max(b for _, b in wins) + 1
nb = int((T1 - T0) / DT) + 1
ov = [[max(0.0, min(b, T0 + (k + 1) * DT) - max(a, T0 + k * DT)) for k in range(nb)] for a, b in wins]
P = [IDLE + ww(sum(o[k] for o in ov) / DT) for k in range(nb)]
rows = []
bad = []


def num(x):
    return x is None or (isinstance(x, (int, float)) and not math.isnan(x) and not math.isinf(x))


for i, r in enumerate(res):
    a, b = wins[i]
    T = b - a
    E = sum(P[k] * ov[i][k] for k in range(nb))  # card energy in window
    share = 0.0
    conc = 0.0
    for k in range(nb):
        if ov[i][k] <= 0:
            continue
        tot = sum(o[k] for o in ov)
        share += P[k] * DT * ov[i][k] / tot if tot > 0 else 0
        conc += tot / DT * ov[i][k]
    true_w = E / T
    true_ratio = share / E
    true_conc = conc / T
    f = r.get("first") or {}
    s = (r.get("settled") or {}).get("record") or {}
    if r["fmt"] == "neuralwatt":
        fw = f.get("avg_power_watts")
        fr = f.get("attribution_ratio")
        fc = None
        fa = f.get("energy_joules")
        fsec = f.get("duration_seconds")
    else:
        fw = f.get("mean_watts")
        fc = f.get("concurrency")
        fa = f.get("allocated_joules")
        fsec = f.get("seconds")
        fr = (fa / (fw * fsec)) if (fa is not None and fw and fsec) else None
    sw, sc, sa, ssec = s.get("mean_watts"), s.get("concurrency"), s.get("allocated_joules"), s.get("seconds")
    sr = (sa / (sw * ssec)) if (sa is not None and sw and ssec) else None
    for nm, v in (
        ("first_w", fw),
        ("first_ratio", fr),
        ("first_conc", fc),
        ("set_w", sw),
        ("set_conc", sc),
        ("first_alloc", fa),
    ):
        if not num(v) or (v is not None and v < 0) or (nm.endswith("ratio") and v is not None and v > 1):
            bad.append((r["tag"], r["id"], nm, v))
    rows.append(
        (
            r["tag"],
            r["fmt"][:4],
            "S" if r["stream"] else "J",
            r["work"],
            round(T, 2),
            r["status"],
            round(true_conc, 2),
            fc,
            sc,
            round(true_w),
            fw and round(fw),
            sw and round(sw),
            round(true_ratio, 3),
            fr and round(fr, 3),
            sr and round(sr, 3),
            round(share, 1),
            fa and round(fa, 1),
            sa and round(sa, 1),
            s.get("settled"),
        )
    )
print(
    "%-7s %-4s %s %4s %5s %3s | conc true/first/set | W true/first/set | ratio true/first/set | alloc true/first/set settled"
    % ("tag", "fmt", "k", "work", "T", "st")
)
for row in rows:
    print(
        "%-7s %-4s %s %4s %5s %3s | %5s %5s %5s | %4s %5s %5s | %6s %6s %6s | %6s %6s %6s %s"
        % tuple(str(x) for x in row)
    )
print("BAD values:", bad)
# group medians
import statistics as st

for tag in sorted(set(r[0] for r in rows)):
    g = [r for r in rows if r[0] == tag]

    def rel(i, j):
        v = [r[j] / r[i] for r in g if r[j] is not None and r[i]]
        return round(st.median(v), 3) if v else None

    print(
        tag,
        "first_w/true",
        rel(9, 10),
        "set_w/true",
        rel(9, 11),
        "first_ratio/true",
        rel(12, 13),
        "set_ratio/true",
        rel(12, 14),
        "first_alloc/true",
        rel(15, 16),
        "set_alloc/true",
        rel(15, 17),
    )
