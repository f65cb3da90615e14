"""The sequential pipeline hands each layer to the checkpoint writer before it quantizes the next one."""

from quantkit.quantize.pipeline import quantize_model
from quantkit.recipes import load_recipe


def test_each_layer_reaches_the_sink_before_the_next_is_quantized(tiny_model):
    events = []

    def sink(dense, quantized):
        layers = {name.split(".")[2] for name in [*dense, *quantized] if ".layers." in name}
        events.append(("sink", sorted(layers), len(quantized)))
        if not layers:
            assert {"model.embed_tokens.weight", "model.norm.weight"} <= set(dense)

    summary = quantize_model(tiny_model, load_recipe("rtn-w4a16-g64"), None, sink,
                             on_layer=lambda done, total: events.append(("done", done)))
    assert events == [("sink", ["0"], 7), ("done", 1), ("sink", ["1"], 7), ("done", 2), ("sink", [], 0)]
    assert len(summary.reports) == 14 and summary.ignored == []
