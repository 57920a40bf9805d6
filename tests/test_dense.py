"""Dense's kernel layouts: "out_in" ([units, input_dim], serving copies) computes what
"in_out" (Keras' and Google's [input_dim, units]) computes with the transposed kernel.

The reference is Keras' own `keras.layers.Dense` holding the same weights, on 2-D and 3-D
inputs, under the float32, mixed_bfloat16 and bfloat16 policies; on JAX as well (the layer
is `keras.ops` code), in a subprocess under the integration tier.
"""

import keras
import numpy as np
import pytest
from conftest import run_on_backend

from bert_keras.layers.dense import Dense

IN, UNITS = 24, 40
TOLERANCE = {"float32": 1e-5, "mixed_bfloat16": 2e-2, "bfloat16": 2e-2}  # of the outputs' scale


def _reference_and_layers(dtype, activation=None, seed=0):
    rng = np.random.default_rng(seed)
    kernel = rng.normal(0, 0.3, (IN, UNITS)).astype("float32")
    bias = rng.normal(0, 0.3, (UNITS,)).astype("float32")
    reference = keras.layers.Dense(UNITS, activation=activation, dtype="float32")
    reference.build((None, IN))
    reference.set_weights([kernel, bias])
    layers = {}
    for layout, stored in (("in_out", kernel), ("out_in", kernel.T)):
        layer = Dense(UNITS, activation=activation, kernel_layout=layout, dtype=dtype)
        layer.build((None, IN))
        assert tuple(layer.kernel.shape) == stored.shape
        layer.set_weights([stored, bias])
        layers[layout] = layer
    return reference, layers


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16", "bfloat16"])
@pytest.mark.parametrize("shape", [(5, IN), (2, 7, IN)])
def test_out_in_computes_what_in_out_computes(dtype, shape):
    reference, layers = _reference_and_layers(dtype, activation="tanh")
    x = np.random.default_rng(1).normal(0, 1, shape).astype("float32")
    expected = keras.ops.convert_to_numpy(reference(x))
    scale = np.abs(expected).max()
    for layout, layer in layers.items():
        got = keras.ops.convert_to_numpy(keras.ops.cast(layer(x), "float32"))
        assert got.shape == shape[:-1] + (UNITS,)
        assert np.abs(got - expected).max() <= TOLERANCE[dtype] * scale, layout
    out_in = keras.ops.convert_to_numpy(keras.ops.cast(layers["out_in"](x), "float32"))
    in_out = keras.ops.convert_to_numpy(keras.ops.cast(layers["in_out"](x), "float32"))
    if dtype == "float32":
        np.testing.assert_allclose(out_in, in_out, rtol=1e-5, atol=1e-6)


@pytest.mark.integration  # JAX in a subprocess: ~30 s.
@pytest.mark.parametrize("backend", ["jax"])
def test_out_in_on_jax(backend):
    if run_on_backend(backend, __file__, f"test_out_in_on_jax[{backend}]"):
        return
    for dtype in TOLERANCE:
        test_out_in_computes_what_in_out_computes(dtype, (2, 7, IN))


def test_config_round_trip_and_the_default_layout():
    layer = Dense(UNITS, kernel_layout="out_in", name="d")
    config = layer.get_config()
    assert config["kernel_layout"] == "out_in"
    assert Dense.from_config(config).kernel_layout == "out_in"
    # Configs written before the argument existed load as Keras' layout.
    del config["kernel_layout"]
    assert Dense.from_config(config).kernel_layout == "in_out"


def test_bad_layout_lora_and_quantization_are_refused():
    with pytest.raises(ValueError, match=r"`kernel_layout` must be one of \('in_out', "
                                         r"'out_in'\). Received: kernel_layout='oi'"):
        Dense(UNITS, kernel_layout="oi")
    with pytest.raises(ValueError, match="LoRA needs kernel_layout='in_out'"):
        Dense(UNITS, kernel_layout="out_in", lora_rank=2)
    layer = Dense(UNITS, kernel_layout="out_in")
    layer.build((None, IN))
    with pytest.raises(ValueError, match="LoRA needs kernel_layout='in_out'"):
        layer.enable_lora(2)
    with pytest.raises(ValueError, match="Quantization needs kernel_layout='in_out'"):
        layer.quantize("int8")
