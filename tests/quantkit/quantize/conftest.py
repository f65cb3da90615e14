import pytest

from tests.conftest import chat_rows, write_jsonl


@pytest.fixture(scope="session")
def calib_dir(tiny_model, tmp_path_factory):
    """A `quantkit calibrate` run on the tiny model: 12 chat samples of up to 64 tokens."""
    from quantkit.calibration.run import CalibrateOptions, calibrate

    root = tmp_path_factory.mktemp("tiny-calib")
    data = write_jsonl(root / "calib.jsonl", chat_rows(24))
    calibrate(CalibrateOptions(model=str(tiny_model), dataset=str(data), out=root / "calib", num_samples=12,
                               max_seq_len=64))
    return root / "calib"
