

def test_an_overdue_step_with_idle_ranks_is_one_warning_per_step(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> list[str]:
        now = [NOW]
        snapshot = snap(61.0, NOW, stage="waiting for a batch")
        watch, failures = watch_of([Actor(0)], now, snapshot)
        for _ in range(4):
            assert await watch.tick()
        assert failures == []
        return [r.getMessage() for r in caplog.records if "is overdue" in r.getMessage()]

    with caplog.at_level("WARNING", logger="telescope.runtime"):
        (line,) = asyncio.run(scenario())
    assert line.startswith("step 7 is overdue: running for 1m01s") and "every trainer rank is idle" in line
    assert line.endswith("(the stall watchdog ends the run at stall_timeout_s: 1800s)")
