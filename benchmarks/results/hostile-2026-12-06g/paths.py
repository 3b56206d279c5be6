# A hostile trial's script (2026-12-06g), kept as it ran.
# Hostile35 (c): does each path remedy's example pass the check it is given under?
from giul_asgi.asgi.options import Options

cases = [
    dict(energy_path="/metrics", metrics_path="prom"),
    dict(energy_path="energy", metrics_path="/energy"),
    dict(energy_path="/metrics", metrics_path="/metrics"),
    dict(energy_path="/prometheus", metrics_path="/prometheus/x"),
    dict(energy_path="/metrics/", metrics_path="/metrics"),
    dict(energy_path="/energy", metrics_path="/energy/"),
    dict(energy_path="/energy ", metrics_path=None),
    dict(energy_path="/energy?x=1"),
    dict(energy_path="//"),
    dict(energy_path="/e", metrics_path="/e"),
]
for kw in cases:
    try:
        Options.build(**kw)
        print("ACCEPTED", kw)
    except Exception as e:
        print("REFUSED ", kw, "->", e)
        import re

        m = re.search(r'e\.g\. (\w+)="([^"]+)"', str(e))
        if m:
            fixed = dict(kw)
            fixed[m.group(1)] = m.group(2)
            try:
                Options.build(**fixed)
                print("   remedy taken: OK", fixed)
            except Exception as e2:
                print("   remedy REFUSED:", fixed, "->", e2)
