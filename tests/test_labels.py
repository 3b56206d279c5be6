"""Labels that stay true while a reader fails, down to a request's stages."""

from __future__ import annotations

from test_ledger import Faulty, Run

from giul_asgi.meter import Meter


def test_a_stage_is_labelled_by_the_same_rule_as_its_figure() -> None:
    run = Run(seed=5)
    faulty = Faulty(run, "raises")
    for _ in range(6):
        faulty.request(0.3, 180.0, failing=False)
        faulty.advance(0.25, failing=False)
    meter = Meter(run.ledger)
    meter.open()
    job = run.card.start_job(180.0)
    faulty.advance(0.2, failing=True)
    meter.mark("retrieve")
    faulty.advance(0.2, failing=True)
    run.card.stop_job(job)
    meter.close()
    e = meter.figure()
    assert e.method == "estimated" and set(e.stages) == {"retrieve"}
    stage = e.stages["retrieve"]
    assert stage.method == "estimated" and "the reader is failing" in (stage.error or "")
