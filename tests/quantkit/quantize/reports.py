"""What the quantize tests check in a run's per-linear reports."""


def assert_beats_rounding(result, linears: int, margin: float = 0.9) -> None:
    """Every quantized linear was reported, and the method's mean relative output error is below
    ``margin`` times plain rounding's on the same inputs."""
    reports = [r for r in result.reports if r.error is not None]
    assert len(reports) == linears
    mean = sum(r.error for r in reports) / len(reports)
    mean_rtn = sum(r.error_rtn for r in reports) / len(reports)
    assert mean < margin * mean_rtn, (mean, mean_rtn)
