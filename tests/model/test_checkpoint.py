"""HF-format folders: rlkit's Qwen3 saves a folder transformers loads, and loads it back bit-exactly."""

import json

import pytest
import torch

from rlkit import NumericsContract, ops
from rlkit.bitwise import assert_bitwise_equal
from rlkit.model import CheckpointError, ForwardBatch, build_model, load_pretrained, preset, save_pretrained
from rlkit.model.checkpoint import weights_checksum


@pytest.fixture(scope="module")
def tiny_fp32():
    return build_model(preset("tiny").with_dtype("float32"), seed=7)


def test_round_trip_is_bit_exact(tiny_fp32, tmp_path):
    save_pretrained(tiny_fp32, tmp_path / "m")
    back = load_pretrained(tmp_path / "m")
    assert back.config.hidden_size == 128 and back.config.dtype == "float32"
    for (name, a), (_, b) in zip(tiny_fp32.state_dict().items(), back.state_dict().items()):
        assert_bitwise_equal(b, a, name)
    assert weights_checksum(back.state_dict()) == weights_checksum(tiny_fp32.state_dict())


def test_transformers_loads_the_folder_and_agrees_with_the_native_path(tiny_fp32, tmp_path):
    """Closeness, not parity: transformers' own Qwen3 (eager attention, fp32) against rlkit's native path;
    the tolerance (max |logit diff| < 1e-4 at logits of magnitude ~1) covers reduction-order differences."""
    import transformers

    save_pretrained(tiny_fp32, tmp_path / "m")
    hf = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path / "m"), dtype=torch.float32,
                                                       attn_implementation="eager").eval()
    ids = torch.randint(0, 151_000, (1, 57), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits[0]
        with ops.use_contract(NumericsContract.native()):
            ours = tiny_fp32.logits(tiny_fp32(ForwardBatch.packed([ids[0]])))
        with ops.use_contract(NumericsContract.default()):
            strict = tiny_fp32.logits(tiny_fp32(ForwardBatch.packed([ids[0]])))
    assert float((ours - ref).abs().max()) < 1e-4
    assert float((strict - ref).abs().max()) < 1e-4


def test_bad_folders_fail_with_a_clear_message(tiny_fp32, tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(tmp_path)
    folder = save_pretrained(tiny_fp32, tmp_path / "m", with_tokenizer=False)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["hidden_size"] = 256
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="shape"):
        load_pretrained(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_pretrained(folder)


def test_untied_preset_has_its_own_head():
    cfg = preset("qwen3-8b")
    assert not cfg.tie_word_embeddings and cfg.hidden_size == 4096 and cfg.num_hidden_layers == 36
    assert abs(cfg.num_parameters() / 1e9 - 8.19) < 0.01
