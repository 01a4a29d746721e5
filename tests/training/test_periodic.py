from jaxformer.training.periodic import Periodic, itstime, run_due


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
