"""Where `load` puts a model's weights: layer counts, llama.cpp's tensor split (`tensor_split`, its -ts) and
overrides of single weights (`override_tensor`, its -ot), over up to 16 CPU backends with the built-in model
(4 layers). Every placement gives the greedy tokens of one backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import pyggml.models as pm
from pyggml.backends.cpu import cpu_init
from pyggml.core.errors import ArgumentError, GGMLError, LimitExceededError
from pyggml.models.builtin import builtin_model_path
from pyggml.models.placement import backend_index, layers_by_counts, layers_by_split

PROMPT = "The module"


@pytest.fixture(scope="module")
def want(builtin_greedy_tokens: list[int]) -> list[int]:
    """The greedy tokens of the whole model on one CPU backend."""
    return builtin_greedy_tokens


@pytest.fixture
def loaded() -> Iterator[Any]:
    """`loaded(n_backends, **load_keywords)` -> (model, backends); the models are freed after the test."""
    models: list[pm.Model] = []

    def make(n_backends: int, **kw: Any) -> tuple[pm.Model, list[Any]]:
        backends = [cpu_init(1) for _ in range(n_backends)]
        models.append(pm.load(builtin_model_path(), backends=backends, n_ctx=64, progress=False, **kw))
        return models[-1], backends

    yield make
    for m in models:
        m.free()


def tokens(model: pm.Model) -> list[int]:
    return list(model.generate(model.tokenize(PROMPT), 8, stop_at_eos=False))


def positions(items: list[Any], backends: list[Any]) -> list[int]:
    """The position of each backend of `items` in `backends`, by identity (two CPU backends are two)."""
    return [next(i for i, b in enumerate(backends) if b is x) for x in items]


# llama.cpp's load_tensors with every layer offloaded: splits = the cumulative proportions over their sum;
# layer il (the output layer is il = n_layer) goes to std::upper_bound(splits, il / (n_layer + 1)), the first
# backend whose split point is greater. With 4 layers the points il / 5 are 0, .2, .4, .6 and .8 (output).
SPLITS = [
    ((1, 1, 2), [0, 0, 1, 2], 2),  # splits .25 .5 1
    ((1, 1, 1), [0, 0, 1, 1], 2),  # .33 .67 1: the last backend holds only the output layer
    ((0, 1, 1), [1, 1, 1, 2], 2),  # 0 .5 1: a zero takes nothing
    ((1, 0, 1), [0, 0, 0, 2], 2),  # .5 .5 1
    ((1, 1, 0), [0, 0, 0, 1], 1),  # .5 1 1: a trailing zero takes nothing either
    ((0, 0, 1), [2, 2, 2, 2], 2),
    ((3, 1), [0, 0, 0, 0], 1),  # .75 1: the output layer alone on the second
    ((1, 4), [0, 1, 1, 1], 1),  # .2 1: layer 1 sits on the point .2, upper_bound takes the next backend
    ((1, 1, 1, 1), [0, 0, 1, 2], 3),  # .25 .5 .75 1
    ((5,), [0, 0, 0, 0], 0),
]


@pytest.mark.parametrize("split, layers, output", SPLITS, ids=lambda x: "-".join(map(str, x)) if isinstance(x, tuple)
                         else None)
def test_layers_by_split_is_llama_cpps_rule(split: tuple[int, ...], layers: list[int], output: int) -> None:
    assert layers_by_split(4, split) == (layers, output)


def test_layers_by_split_of_a_32_layer_model() -> None:
    # 1,1 over 33 offloaded layers: il / 33 < .5 for il <= 16, so 17 layers on the first, 15 and the output on
    # the second; 3,1: il / 33 < .75 for il <= 24
    assert layers_by_split(32, [1, 1]) == ([0] * 17 + [1] * 15, 1)
    assert layers_by_split(32, [3, 1]) == ([0] * 25 + [1] * 7, 1)
    assert layers_by_split(32, [0.1, 0.2, 0.7]) == ([0] * 4 + [1] * 6 + [2] * 22, 2)  # .1 .3 1: il <= 3, il <= 9


def test_layers_by_counts() -> None:
    assert layers_by_counts(4, 3, [1, 1]) == [0, 1, 2, 2]  # the rest on the backend after the last count
    assert layers_by_counts(4, 3, [1, 1, 1]) == [0, 1, 2, 2]  # every backend counted: the rest on the last
    assert layers_by_counts(4, 2, [9]) == [0, 0, 0, 0]
    assert layers_by_counts(4, 2, None) == [0, 0, 0, 0]


@pytest.mark.parametrize("split, layers, output", [s for s in SPLITS if len(s[0]) == 3])
@pytest.mark.slow
def test_tensor_split_over_three_backends_keeps_the_tokens(split: tuple[int, ...], layers: list[int], output: int,
                                                           want: list[int], loaded: Any) -> None:
    model, backends = loaded(3, tensor_split=list(split))
    assert positions(model.layer_backend, backends) == layers
    assert positions([model.output_backend], backends) == [output]
    assert positions([model.w["output_norm.weight"].buffer.backend], backends) == [output]
    assert positions([model.w["token_embd.weight"].buffer.backend], backends) == [layers[0]]
    assert positions(model.kv_backend, backends) == layers  # each layer's cache with its layer
    assert tokens(model) == want


@pytest.mark.parametrize("n_backends, counts, layers", [
    (3, [1, 1], [0, 1, 2, 2]),
    (3, [0, 3], [1, 1, 1, 2]),
    (4, [1, 1, 1, 1], [0, 1, 2, 3]),
    (4, [0, 0, 2], [2, 2, 3, 3]),
])
def test_counts_over_three_and_four_backends(n_backends: int, counts: list[int], layers: list[int], want: list[int],
                                             loaded: Any) -> None:
    model, backends = loaded(n_backends, n_layers_on=counts)
    assert positions(model.layer_backend, backends) == layers
    assert model.output_backend is model.layer_backend[-1]
    assert tokens(model) == want


def test_sixteen_backends_the_scheduler_s_limit(want: list[int], loaded: Any) -> None:
    model, backends = loaded(16, n_layers_on=[0] * 12 + [1, 1, 1])
    assert positions(model.layer_backend, backends) == [12, 13, 14, 15]
    assert tokens(model) == want
    model, backends = loaded(16, tensor_split=[1] * 16)  # points k/16: .2 -> 3, .4 -> 6, .6 -> 9, .8 -> 12
    assert positions(model.layer_backend, backends) == [0, 3, 6, 9]
    assert positions([model.output_backend], backends) == [12]
    assert tokens(model) == want
    with pytest.raises(LimitExceededError, match="17 backends exceed GGML_SCHED_MAX_BACKENDS = 16"):
        loaded(17)


@pytest.mark.parametrize("target", [1, "1", "CPU#1", "cpu#1"])
def test_override_tensor_puts_the_weights_on_its_backend(target: Any, want: list[int], loaded: Any) -> None:
    model, backends = loaded(2, override_tensor=[("ffn_down", target)])
    for name, t in model.w.items():
        on = positions([t.buffer.backend], backends)[0]
        assert on == (1 if "ffn_down" in name else 0), name
    assert sorted(model.overridden) == [f"blk.{i}.ffn_down.weight" for i in range(4)]
    assert positions(model.layer_backend, backends) == [0, 0, 0, 0]
    assert positions(model.kv_backend, backends) == [0, 0, 0, 0]  # the KV cache stays with the layer
    assert tokens(model) == want
    # the scheduler computes the products with ffn_down where the weight is
    on_1 = [n for s in model.runner.sched.splits if s.backend is backends[1] for n in s.graph.nodes]
    assert on_1 and all(any(src is not None and (src.name or "").endswith("ffn_down.weight") for src in n.src)
                        for n in on_1)


def test_override_tensor_by_backend_object_and_the_first_match_wins(want: list[int], loaded: Any) -> None:
    backends = [cpu_init(1) for _ in range(3)]
    model = pm.load(builtin_model_path(), backends=backends, n_ctx=64, progress=False, n_layers_on=[2],
                    override_tensor=[(r"blk\.0\.ffn_down", backends[2]), ("ffn_(up|down)", 0)])
    try:
        on = {name: positions([t.buffer.backend], backends)[0] for name, t in model.w.items()}
        assert on["blk.0.ffn_down.weight"] == 2  # the first override that finds it
        assert on["blk.3.ffn_down.weight"] == 0 and on["blk.3.ffn_up.weight"] == 0  # layer 3 is on backend 1
        assert on["blk.3.ffn_gate.weight"] == 1
        assert tokens(model) == want
    finally:
        model.free()


def test_an_override_that_matches_nothing_is_logged(caplog: pytest.LogCaptureFixture, loaded: Any) -> None:
    with caplog.at_level("WARNING", logger="pyggml.models"):
        loaded(2, override_tensor=[("no_such_weight", 1)])
    assert "override_tensor 'no_such_weight' matches no weight" in caplog.text


@pytest.mark.parametrize("kw, words", [
    ({"tensor_split": [1, 1], "n_layers_on": [1]}, "n_layers_on or tensor_split, not both"),
    ({"tensor_split": [1, 1, 1]}, "3 proportion(s) for 2 backend(s)"),
    ({"tensor_split": [1, -2]}, "finite and >= 0, got -2.0"),
    ({"tensor_split": [0, 0]}, "all 0"),
    ({"tensor_split": [1, float("nan")]}, "got nan"),
    ({"override_tensor": [("ffn[", 1)]}, "bad regex 'ffn['"),
    ({"override_tensor": [("ffn", "CPU")]}, "'CPU' names 2 backends (positions 0, 1): say which by position"),
    ({"override_tensor": [("ffn", "Torch#0")]}, "backend 0 is CPU#0, not 'Torch'"),
    ({"override_tensor": [("ffn", 2)]}, "there is no backend 2"),
    ({"override_tensor": [("ffn", cpu_init(1))]}, "is not one of the model's backends"),
    ({"override_tensor": ["ffn=1"]}, "a (regex, backend) pair"),
    ({"n_layers_on": [1, 1, 1]}, "3 counts for 2 backends"),
])
def test_bad_placement_is_an_argument_error_naming_it(kw: dict[str, Any], words: str, loaded: Any) -> None:
    with pytest.raises(ArgumentError) as e:
        loaded(2, **kw)
    assert words in str(e.value)
    assert isinstance(e.value, GGMLError)


def test_backend_index() -> None:
    aliases = [["torch", "Torch(cpu)"], ["cpu", "CPU"], ["cpu", "CPU"]]
    assert backend_index("torch", aliases, "x") == 0
    assert backend_index("TORCH(cpu)", aliases, "x") == 0
    assert backend_index("CPU#2", aliases, "x") == 2
    assert backend_index(" 1 ", aliases, "x") == 1
    with pytest.raises(ArgumentError, match=r"^x: 'cpu' names 2 backends \(positions 1, 2\)"):
        backend_index("cpu", aliases, "x")
    with pytest.raises(ArgumentError, match=r"'vulkan' is not one of the backends \(torch, cpu#1, cpu#2\)"):
        backend_index("vulkan", aliases, "x")
    with pytest.raises(ArgumentError, match="a backend is a position or a name"):
        backend_index(True, aliases, "x")
