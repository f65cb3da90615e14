import pytest

from quantkit.errors import QuantkitError
from quantkit.outdir import atomic_output_dir


def test_success_publishes_and_failure_leaves_nothing(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_output_dir(target) as staging:
            (staging / "half.bin").write_text("x")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with atomic_output_dir(target) as staging:
        (staging / "done.txt").write_text("ok")
    assert (target / "done.txt").read_text() == "ok"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_existing_target_needs_overwrite_and_a_file_is_refused(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(QuantkitError, match="already exists"):
        with atomic_output_dir(target):
            pass
    (tmp_path / "file").write_text("x")
    with pytest.raises(QuantkitError, match="is a file"):
        with atomic_output_dir(tmp_path / "file", overwrite=True):
            pass
