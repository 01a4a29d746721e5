from jaxformer.training.periodic import Periodic, itstime, run_at_start, run_due


def test_itstime_every_n_steps_and_at_the_last():
    assert [step for step in range(1, 11) if itstime(step, 3, 10)] == [3, 6, 9, 10]
    assert [step for step in range(1, 11) if itstime(step, 3, 10, at_last_step=False)] == [3, 6, 9]
    assert not any(itstime(step, 0, 10) for step in range(1, 11))  # 0 turns it off, the last step too


def test_run_due_runs_the_due_actions_in_order():
    calls = []
    actions = [
        Periodic("log", 2, lambda step: calls.append(("log", step)), at_last_step=False),
        Periodic("evaluate", 5, lambda step: calls.append(("evaluate", step))),
        Periodic("checkpoint", 4, lambda step: calls.append(("checkpoint", step))),
    ]
    for step in range(1, 8):
        run_due(actions, step, last_step=7)
    assert calls == [
        ("log", 2),
        ("log", 4),
        ("checkpoint", 4),
        ("evaluate", 5),
        ("log", 6),
        ("evaluate", 7),
        ("checkpoint", 7),
    ]


def test_work_that_spends_the_budget_makes_its_step_the_last_before_the_checkpoint():
    """Step 50's evaluation spends the time budget: step 50 is the run's last, with the BLEU and
    checkpoint a last step has, once each (not again at step 51, after a second evaluation)."""
    calls, timed, asked = [], [], []
    actions = [
        Periodic("log", 1, lambda step: calls.append(("log", step)), at_last_step=False),
        Periodic("evaluate", 50, lambda step: calls.append(("evaluate", step)), timed=True),
        Periodic("bleu", 100, lambda step: calls.append(("bleu", step)), timed=True),
        Periodic("checkpoint", 100, lambda step: calls.append(("checkpoint", step)), timed=True, saves=True),
    ]

    def ends_here():
        asked.append(len(calls))
        return True

    assert run_due(actions, 49, 1000, lambda name, seconds: timed.append(name), ends_here) == 1000
    assert asked == []  # no work ran: the budget is read at the checks
    assert run_due(actions, 50, 1000, lambda name, seconds: timed.append(name), ends_here) == 50
    assert asked == [3]  # after the evaluation, before the checkpoint
    assert calls == [("log", 49), ("log", 50), ("evaluate", 50), ("bleu", 50), ("checkpoint", 50)]
    assert timed == ["evaluate", "bleu", "checkpoint"]


def test_the_start_is_measured_by_the_named_work_that_is_due_at_all():
    """A fine-tuning run's step 0: its evaluation and BLEU (with their timing), never its log or
    checkpoint, and no BLEU where training.bleu_every_steps is 0."""
    calls, timed = [], []

    def actions(bleu_every_steps):
        return [
            Periodic("log", 1, lambda step: calls.append(("log", step)), at_last_step=False),
            Periodic("evaluate", 50, lambda step: calls.append(("evaluate", step)), timed=True),
            Periodic("bleu", bleu_every_steps, lambda step: calls.append(("bleu", step)), timed=True),
            Periodic("checkpoint", 100, lambda step: calls.append(("checkpoint", step)), timed=True, saves=True),
        ]

    run_at_start(actions(100), ("bleu", "evaluate"), lambda name, seconds: timed.append(name))
    assert calls == [("evaluate", 0), ("bleu", 0)] and timed == ["evaluate", "bleu"]  # in the list's order
    calls.clear()
    run_at_start(actions(0), ("evaluate", "bleu"))
    assert calls == [("evaluate", 0)]
    calls.clear()
    run_at_start(actions(100), ())  # a run from scratch or resumed: nothing
    assert calls == []
