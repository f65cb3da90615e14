"""Activations offloaded to disk read back exactly, clean up after themselves, and quantize to the same bytes."""

import gc
import warnings
import weakref

import pytest
import torch
from safetensors.torch import load_file

from quantkit.errors import QuantkitError
from quantkit.quantize import activations
from quantkit.quantize.activations import (FileTensors, InMemory, OnDisk, activation_bytes, activation_store,
                                           warn_if_activations_outgrow_memory)
from quantkit.quantize.pipeline import quantize_model
from quantkit.recipes import load_recipe


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_file_tensors_read_back_every_sample_exactly(tmp_path, dtype):
    torch.manual_seed(0)
    tensors = [torch.randn(tokens, 12).to(dtype) for tokens in (5, 1, 9)] + [torch.randn(4, 3, 2).to(dtype)]
    stored = FileTensors.write(tmp_path / "a.bin", iter(tensors))
    assert len(stored) == 4
    for original, read in zip(tensors, stored):
        assert read.dtype == dtype and torch.equal(read, original)
    assert torch.equal(stored[-1], tensors[-1]) and [t.shape for t in stored[1:3]] == [(1, 12), (9, 12)]
    with pytest.raises(IndexError):
        stored[4]


def test_each_read_is_a_fresh_tensor_and_the_file_goes_with_the_sequence(tmp_path):
    stored = FileTensors.write(tmp_path / "a.bin", [torch.ones(3, 4)])
    first = stored[0]
    first += 1  # a consumer may edit what it read; the stored sample stays as written
    assert torch.equal(stored[0], torch.ones(3, 4))
    path = stored.path
    del stored
    gc.collect()
    assert not path.exists()


def test_a_non_contiguous_tensor_is_stored_as_its_values(tmp_path):
    wide = torch.arange(24.0).view(4, 6)
    stored = FileTensors.write(tmp_path / "a.bin", [wide.T, wide[:, ::2]])
    assert torch.equal(stored[0], wide.T) and torch.equal(stored[1], wide[:, ::2])


def test_the_store_folder_is_removed_even_when_the_work_fails(tmp_path):
    with pytest.raises(RuntimeError), activation_store(tmp_path) as store:
        assert isinstance(store, OnDisk) and store.offloaded
        kept = store.keep(torch.zeros(2, 2) for _ in range(3))
        assert len(list(store.directory.iterdir())) == 1 and len(kept) == 3
        raise RuntimeError("a layer failed")
    assert list(tmp_path.iterdir()) == []
    with activation_store(None) as store:
        assert isinstance(store, InMemory) and not store.offloaded


def test_an_unusable_offload_folder_is_refused_naming_it(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(QuantkitError, match=f"--offload-activations: {missing} is not a directory"):
        with activation_store(missing):
            pass


@pytest.mark.parametrize("recipe, fp_target_samples", [
    ("gptq-w4a16-g64", None), ("gptq-w4a16-g64-fp-targets", None),
    ("gptq-w4a16-g64-fp-targets", 2),  # the full-precision stream on 2 of the 4 samples
    ("awq-w4a16-g64-kv-fp8", None), ("fp8-w8a8-static", None)])
def test_offloaded_activations_quantize_to_the_same_tensors(tiny_model, tmp_path, recipe, fp_target_samples):
    torch.manual_seed(0)
    samples = [torch.randint(3, 390, (length,)).tolist() for length in (40, 24, 40, 33)]
    recipe = load_recipe(recipe)
    if fp_target_samples:
        method = recipe.quantization.model_copy(update={"fp_target_samples": fp_target_samples})
        recipe = recipe.model_copy(update={"quantization": method})

    def run(activations) -> dict[str, torch.Tensor]:
        tensors = {}

        def sink(dense, quantized):
            tensors.update(dense)
            for name, weight in quantized.items():
                tensors[name] = weight.dequantize()

        quantize_model(tiny_model, recipe, samples, sink, activations=activations)
        return tensors

    in_memory = run(InMemory())
    with activation_store(tmp_path) as store:
        offloaded = run(store)
        gc.collect()
        assert list(store.directory.iterdir()) == []  # every stage's file went with its sequence
    assert in_memory.keys() == offloaded.keys()
    for name in in_memory:
        assert torch.equal(in_memory[name], offloaded[name]), name


def test_quantize_cli_offloads_and_refuses_a_missing_folder(tiny_model, tmp_path, run_cli):
    from tests.conftest import chat_rows, write_jsonl

    data = write_jsonl(tmp_path / "calib.jsonl", chat_rows(8))
    common = ("quantize", "--model", str(tiny_model), "--recipe", "gptq-w4a16-g64", "--dataset", str(data),
              "--num-samples", "4", "--max-seq-len", "32")
    code, _, err = run_cli(*common, "--out", str(tmp_path / "a"), "--offload-activations", str(tmp_path / "nope"))
    assert code == 2 and "--offload-activations" in err and "nope" in err and not (tmp_path / "a").exists()
    spill = tmp_path / "spill"
    spill.mkdir()
    code, _, err = run_cli(*common, "--out", str(tmp_path / "b"), "--offload-activations", str(spill))
    assert code == 0, err
    assert list(spill.iterdir()) == []
    plain = tmp_path / "c"
    assert run_cli(*common, "--out", str(plain))[0] == 0
    offloaded = load_file(tmp_path / "b" / "model.safetensors")
    for name, tensor in load_file(plain / "model.safetensors").items():
        assert torch.equal(tensor, offloaded[name]), name


class _Counted(list):
    """A kept sequence that tracks how many bytes of activations are alive at once."""
    live = peak = 0

    def __init__(self, tensors):
        super().__init__(tensors)
        size = sum(t.numel() * t.element_size() for t in self)
        _Counted.live += size
        _Counted.peak = max(_Counted.peak, _Counted.live)
        weakref.finalize(self, _Counted._drop, size)

    @staticmethod
    def _drop(size):
        _Counted.live -= size


def test_a_slab_is_reused_only_once_no_view_of_it_is_left():
    pool = activations.SlabPool()
    first = activations.Slabs(pool)
    kept = [first.copy(torch.full((4, 8), 1.0)), first.copy(torch.full((3, 8), 2.0))]
    derived = kept[1][None, 1:]  # a view of a view, as consumers make
    del first, kept
    second = activations.Slabs(pool)
    other = second.copy(torch.full((2, 8), 3.0))
    assert other.untyped_storage().data_ptr() != derived.untyped_storage().data_ptr()
    assert torch.equal(derived, torch.full((1, 2, 8), 2.0))  # untouched
    del derived, second  # the first slab is free now; `other` holds the second one
    third = activations.Slabs(pool).copy(torch.zeros(5, 8))
    assert third.untyped_storage().data_ptr() not in {other.untyped_storage().data_ptr()}
    assert len(pool._slabs) == 2 and torch.equal(other, torch.full((2, 8), 3.0))


def test_in_memory_samples_are_aligned_views_packed_into_shared_slabs():
    torch.manual_seed(0)
    samples = [torch.randn(length, 24) for length in (40, 7, 33)] + [torch.randint(0, 9, (5,))]
    kept = InMemory().keep(iter(samples))
    for original, copy in zip(samples, kept, strict=True):
        assert copy.dtype == original.dtype and torch.equal(copy, original)
        assert copy.data_ptr() % activations.ALIGN_BYTES == 0
    storages = {t.untyped_storage().data_ptr() for t in kept}
    assert len(storages) == 2  # the float samples share one slab; the integer one gets its own
    kept[0].zero_()
    assert torch.equal(kept[1], samples[1])  # neighbours in a slab do not overlap


def test_the_activation_estimate_is_near_what_a_gptq_run_holds_at_once(tiny_model):
    from quantkit.models import load_config

    torch.manual_seed(0)
    samples = [torch.randint(3, 390, (40,)).tolist() for _ in range(6)]
    store = InMemory()
    store.keep = _Counted
    quantize_model(tiny_model, load_recipe("gptq-w4a16-g64"), samples, lambda dense, quantized: None,
                   activations=store)
    config = load_config(tiny_model)
    estimate = activation_bytes(config.hidden_size, config.intermediate_size, 6 * 40)
    assert _Counted.peak <= estimate <= 1.5 * _Counted.peak, (_Counted.peak, estimate)


def test_a_run_whose_activations_outgrow_memory_is_warned_before_it_starts(monkeypatch):
    monkeypatch.setattr(activations, "available_memory", lambda: 2**30)
    with pytest.warns(UserWarning, match="need about 1.0 GiB .* 1.0 GiB of memory is available; pass "
                                         "--offload-activations"):
        warn_if_activations_outgrow_memory(2**30, offloaded=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_activations_outgrow_memory(2**30, offloaded=True)
        warn_if_activations_outgrow_memory(2**20, offloaded=False)
