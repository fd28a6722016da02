"""Book <-> Hugging Face Qwen3 weights, checked against `transformers` itself."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from reasoning_from_scratch.qwen3 import QWEN_CONFIG_06_B, Qwen3Model
from safetensors import safe_open

from tests.tiny import tiny_config
from utils.download.standin import standin_state_dict
from utils.generation import generate_text_basic_stream_cache
from utils.hf_interop import convert as hf_interop
from utils.hf_interop.convert import (
    book_config_from_hf,
    book_to_hf_state_dict,
    download_official_qwen3,
    export_hf_folder,
    hf_to_book_state_dict,
    load_hf_checkpoint,
)

transformers = pytest.importorskip("transformers")

TINY = tiny_config()

# Official Qwen/Qwen3-0.6B config.json (transformers 4.51 spelling).
QWEN3_06B_CONFIG_JSON = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 1024,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 16,
    "num_hidden_layers": 28,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


# Qwen3's special-token ids (151643...) lie outside the tiny vocabulary
NO_IDS = {"bos_token_id": None, "eos_token_id": None}


def hf_config(cfg=TINY, tied=True):
    return transformers.Qwen3Config(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["emb_dim"],
        intermediate_size=cfg["hidden_dim"],
        num_hidden_layers=cfg["n_layers"],
        num_attention_heads=cfg["n_heads"],
        num_key_value_heads=cfg["n_kv_groups"],
        head_dim=cfg["head_dim"],
        max_position_embeddings=cfg["context_length"],
        rope_parameters={"rope_type": "default", "rope_theta": cfg["rope_base"]},
        tie_word_embeddings=tied,
    )


def random_hf_model(tied: bool, seed: int = 0):
    """A float32 HF Qwen3 whose every tensor (norms included) is random, so a
    swapped mapping cannot go unnoticed."""
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(hf_config(tied=tied)).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.05)
    return model


def book_model(sd, cfg=TINY):
    model = Qwen3Model(dict(cfg))
    model.load_state_dict(sd)  # strict: every key present, none extra
    return model.eval()


def tied_standin(seed=1, cfg=TINY):
    sd = standin_state_dict(cfg, seed)
    sd["out_head.weight"] = sd["tok_emb.weight"].clone()
    return sd


def untied_standin(seed=1):
    sd = standin_state_dict(TINY, seed)
    gen = torch.Generator().manual_seed(seed + 100)
    sd["out_head.weight"] = sd["out_head.weight"] + 0.02 * torch.randn(
        sd["out_head.weight"].shape, generator=gen
    )
    return sd


def random_ids(n=24, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY["vocab_size"], (2, n), generator=gen)


def assert_logits_close(ours, theirs):
    assert ours.shape == theirs.shape
    assert theirs.std() > 0.1  # logits not so small that 1e-4 says nothing
    # 1e-4, relative to the logit scale (stand-in logits reach ~100)
    scale = theirs.abs().max().clamp(min=1.0)
    assert (ours - theirs).abs().max() < 1e-4 * scale


# --------------------------------------------------------------------------
# Key mapping
# --------------------------------------------------------------------------


def test_mapping_matches_transformers_names_and_round_trips():
    sd = untied_standin()
    hf_sd = book_to_hf_state_dict(sd)
    reference = transformers.Qwen3ForCausalLM(hf_config(tied=False)).state_dict()
    assert set(hf_sd) == set(reference)
    for key, value in hf_sd.items():
        assert value.shape == reference[key].shape, key

    back = hf_to_book_state_dict(hf_sd, tie_word_embeddings=False)
    assert set(back) == set(sd)
    for key in sd:
        assert torch.equal(back[key], sd[key]), key


def test_tied_mapping_drops_and_restores_the_head():
    sd = tied_standin(2)
    hf_sd = book_to_hf_state_dict(sd, tie_word_embeddings=True)
    assert "lm_head.weight" not in hf_sd
    back = hf_to_book_state_dict(hf_sd)  # tying inferred from the missing head
    assert torch.equal(back["out_head.weight"], sd["tok_emb.weight"])
    with pytest.raises(ValueError, match="differs from tok_emb"):
        book_to_hf_state_dict(untied_standin(), tie_word_embeddings=True)


def test_gate_and_up_projections_are_not_swapped():
    sd = untied_standin()
    hf_sd = book_to_hf_state_dict(sd)
    assert (
        hf_sd["model.layers.1.mlp.gate_proj.weight"] is sd["trf_blocks.1.ff.fc1.weight"]
    )
    assert (
        hf_sd["model.layers.1.mlp.up_proj.weight"] is sd["trf_blocks.1.ff.fc2.weight"]
    )
    assert (
        hf_sd["model.layers.1.mlp.down_proj.weight"] is sd["trf_blocks.1.ff.fc3.weight"]
    )


# --------------------------------------------------------------------------
# Loading Hugging Face checkpoints into the book's model
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tied, shard", [(True, False), (False, False), (True, True)], ids=str
)
def test_hf_checkpoint_gives_same_logits_in_book_model(tmp_path, tied, shard):
    hf = random_hf_model(tied)
    kwargs = {"max_shard_size": "100KB"} if shard else {}
    hf.save_pretrained(tmp_path, **kwargs)
    assert (tmp_path / "model.safetensors.index.json").is_file() == shard

    sd, cfg = load_hf_checkpoint(tmp_path, dtype=torch.float32)
    assert cfg == TINY
    ours = book_model(sd, cfg)
    ids = random_ids()
    with torch.no_grad():
        assert_logits_close(ours(ids), hf(ids).logits)


def test_load_accepts_safetensors_file_and_explicit_cfg(tmp_path):
    hf = random_hf_model(tied=False, seed=3)
    hf.save_pretrained(tmp_path)
    sd, cfg = load_hf_checkpoint(tmp_path / "model.safetensors", cfg=TINY)
    assert cfg == TINY and cfg is not TINY
    expected = book_to_hf_state_dict(sd)
    for key, value in hf.state_dict().items():
        assert torch.equal(expected[key], value), key


def test_official_qwen3_config_gives_the_books_config():
    assert book_config_from_hf(QWEN3_06B_CONFIG_JSON) == QWEN_CONFIG_06_B
    # transformers 5 spells RoPE as rope_parameters; same result
    v5 = transformers.Qwen3Config(**QWEN3_06B_CONFIG_JSON).to_dict()
    assert "rope_parameters" in v5
    assert book_config_from_hf(v5) == QWEN_CONFIG_06_B


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "qwen3_moe"}, "only dense"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"attention_bias": True}, "attention_bias"),
        ({"rms_norm_eps": 1e-5}, "rms_norm_eps"),
        ({"num_hidden_layers": None}, "num_hidden_layers"),
    ],
)
def test_config_the_book_cannot_reproduce_is_refused(change, message):
    broken = {**QWEN3_06B_CONFIG_JSON, **change}
    broken = {k: v for k, v in broken.items() if v is not None or k not in change}
    with pytest.raises(ValueError, match=message):
        book_config_from_hf(broken)


# --------------------------------------------------------------------------
# Exporting book weights for transformers / vLLM / SGLang
# --------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_export_loads_in_transformers_with_same_logits(tmp_path, tied):
    sd = tied_standin(4) if tied else untied_standin(4)
    out = export_hf_folder(sd, TINY, tmp_path / "hf", **NO_IDS)

    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is tied
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert ("lm_head.weight" in f.keys()) is not tied

    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    hf.eval()
    ours = book_model(sd)
    ids = random_ids(seed=5)
    with torch.no_grad():
        assert_logits_close(ours(ids), hf(ids).logits)

    # ...and back: the exported folder reads into exactly the same weights
    back, cfg = load_hf_checkpoint(out, dtype=torch.float32)
    assert cfg == TINY
    for key in sd:
        assert torch.equal(back[key], sd[key]), key


def test_export_of_a_model_sharing_one_head_parameter(tmp_path):
    # The book's load_hf_weights_into_qwen ties by sharing the Parameter itself
    model = book_model(untied_standin(11))
    model.out_head.weight = model.tok_emb.weight
    out = export_hf_folder(model, TINY, tmp_path / "hf", **NO_IDS)
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()
        emb = f.get_tensor("model.embed_tokens.weight")
    assert torch.equal(emb, model.tok_emb.weight.detach())


def test_export_greedy_generation_matches_transformers(tmp_path):
    sd = standin_state_dict(TINY, 6)
    out = export_hf_folder(sd, TINY, tmp_path / "hf", **NO_IDS)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    prompt = random_ids(n=7, seed=6)[:1]

    ours = torch.cat(
        list(generate_text_basic_stream_cache(book_model(sd), prompt, 20)), dim=1
    )
    with torch.no_grad():
        theirs = hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=20,
            min_new_tokens=20,
            do_sample=False,
        )[:, prompt.shape[1] :]
    assert ours.shape == (1, 20)
    assert torch.equal(ours, theirs)


def test_export_gives_the_native_batch_paths_greedy_tokens(tmp_path):
    """What a server (vLLM, SGLang) loads: the exported bf16 folder, read by
    `transformers` in bf16, picks the native path's greedy tokens, decoded
    as one continuous batch of prompts of different lengths. Teacher-forced
    along those tokens: bf16 sums in another order move near ties only (the
    bound of the native step against the book's model); a wrong name, tie
    or RoPE setting agrees on almost no step."""
    import utils.fast.build as build
    from tests.tiny import tiny_state_dict
    from utils.fast import BatchDecoder, Request, get_path
    from utils.models import load_book_model

    if build.unsupported_reason() is not None:
        pytest.skip("the native step needs the C kernels (x86-64 AVX2, AArch64)")
    cfg = tiny_config(context_length=512, dtype=torch.bfloat16)
    book = load_book_model(tiny_state_dict(0, cfg), cfg=cfg)
    out = export_hf_folder(book, cfg, tmp_path / "hf", **NO_IDS)
    gen = torch.Generator().manual_seed(0)
    lengths = (3, 17, 30)
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in lengths]
    fast = get_path("fast_native").build(book)
    ours = {i: [] for i in range(len(prompts))}
    requests = [Request(i, p, 40) for i, p in enumerate(prompts)]
    for event in BatchDecoder(fast, len(prompts)).run(requests):
        if event.token is not None:
            ours[event.key].append(event.token)

    # eager attention: torch's bf16 SDPA on the CPU fails under
    # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine (pack_vnni2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.bfloat16, attn_implementation="eager"
    )
    same = 0
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            logits = hf.eval()(torch.tensor([prompt + ours[i]])).logits[0].float()
        picked = logits[len(prompt) - 1 : -1].argmax(dim=-1).tolist()
        assert picked[0] == ours[i][0]  # the prompt's first token
        same += sum(a == b for a, b in zip(picked, ours[i], strict=True))
    assert same >= 0.9 * 40 * len(prompts), same


def test_export_in_bfloat16_records_dtype_and_token_ids(tmp_path):
    cfg = {**TINY, "vocab_size": 151_936 // 32, "dtype": torch.bfloat16}
    sd = tied_standin(7, cfg)
    model = book_model(sd, cfg)  # norm scales live in float32 inside the model
    out = export_hf_folder(model, cfg, tmp_path / "hf", bos_token_id=1, eos_token_id=2)

    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == config["torch_dtype"] == "bfloat16"
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    loaded = transformers.AutoConfig.from_pretrained(out)
    assert loaded.rope_parameters["rope_theta"] == cfg["rope_base"]
    assert loaded.tie_word_embeddings is True


@pytest.mark.heavy_under_emulation
def test_export_with_tokenizer_loads_in_autotokenizer(tmp_path):
    pytest.importorskip("utils.qwen3_tokenizer")
    from tokenizers import Tokenizer

    from utils.download.standin import write_standin_tokenizer

    tok_file = write_standin_tokenizer(tmp_path / "tokenizer-base.json")
    # The real vocabulary, everything else as small as it gets
    cfg = {**TINY, "vocab_size": QWEN_CONFIG_06_B["vocab_size"], "n_layers": 1}
    cfg.update(emb_dim=8, n_heads=2, n_kv_groups=1, head_dim=8, hidden_dim=16)
    sd = standin_state_dict(cfg, 8)

    with pytest.raises(ValueError, match="vocab_size"):  # tokenizer too large
        export_hf_folder(
            standin_state_dict(TINY, 8), TINY, tmp_path / "x", tok_file, **NO_IDS
        )
    assert not (tmp_path / "x").exists()

    chat = export_hf_folder(sd, cfg, tmp_path / "chat", tok_file, eos_token_id=151645)
    chat_tok_config = json.loads((chat / "tokenizer_config.json").read_text())
    assert chat_tok_config["eos_token"] == "<|im_end|>"

    out = export_hf_folder(sd, cfg, tmp_path / "base", tok_file)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (tok.eos_token, tok.eos_token_id) == ("<|endoftext|>", 151643)
    assert tok.pad_token_id == 151643

    raw = Tokenizer.from_file(str(tok_file))
    for text in [
        "Explain large language models.",
        "  héllo\n\n wörld 12345!!",
        "<|im_start|>user\nHi<|im_end|>\n<think>\n\n</think>",
    ]:
        assert tok.encode(text, add_special_tokens=False) == raw.encode(text).ids
        assert tok.decode(raw.encode(text).ids) == text


# --------------------------------------------------------------------------
# Clear errors, nothing half-written
# --------------------------------------------------------------------------


def test_unknown_and_missing_keys_are_named():
    sd = standin_state_dict(TINY, 9)
    sd["trf_blocks.0.att.W_qurey.weight"] = sd.pop("trf_blocks.0.att.W_query.weight")
    with pytest.raises(ValueError, match="W_qurey"):
        book_to_hf_state_dict(sd)

    sd = standin_state_dict(TINY, 9)
    del sd["trf_blocks.1.norm2.scale"]
    with pytest.raises(ValueError, match=r"Missing.*trf_blocks\.1\.norm2\.scale"):
        book_to_hf_state_dict(sd)

    hf_sd = book_to_hf_state_dict(untied_standin())
    hf_sd["model.layers.0.mlp.experts.0.gate_proj.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="experts"):
        hf_to_book_state_dict(hf_sd)

    del hf_sd["model.layers.0.mlp.experts.0.gate_proj.weight"]
    del hf_sd["lm_head.weight"]
    with pytest.raises(ValueError, match="tie_word_embeddings=True"):
        hf_to_book_state_dict(hf_sd, tie_word_embeddings=False)


def test_shape_mismatch_is_reported_with_key_and_shapes(tmp_path):
    random_hf_model(tied=True).save_pretrained(tmp_path)
    wrong = {**TINY, "hidden_dim": 96}
    with pytest.raises(ValueError, match=r"ff\.fc1\.weight.*\(128, 64\).*\(96, 64\)"):
        load_hf_checkpoint(tmp_path, cfg=wrong)
    with pytest.raises(ValueError, match="does not fit"):
        export_hf_folder(standin_state_dict(TINY, 0), wrong, tmp_path / "out")


def test_missing_files_say_what_to_download(tmp_path):
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_hf_checkpoint(tmp_path)
    random_hf_model(tied=True).save_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf_checkpoint(tmp_path)
    assert load_hf_checkpoint(tmp_path, cfg=TINY)[1] == TINY


def test_export_never_leaves_a_half_written_folder(tmp_path, monkeypatch):
    sd = tied_standin(10)
    target = tmp_path / "hf"

    def broken_save(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(hf_interop, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        export_hf_folder(sd, TINY, target, **NO_IDS)
    assert list(tmp_path.iterdir()) == []  # no target, no temp folder
    monkeypatch.undo()

    export_hf_folder(sd, TINY, target, **NO_IDS)
    first = (target / "model.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_hf_folder(untied_standin(), TINY, target)
    assert (target / "model.safetensors").read_bytes() == first

    export_hf_folder(untied_standin(), TINY, target, overwrite=True, **NO_IDS)
    assert (
        json.loads((target / "config.json").read_text())["tie_word_embeddings"] is False
    )
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]


def test_download_reads_hf_endpoint_at_call_time(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return kwargs["local_dir"]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example/")
    folder = download_official_qwen3("Qwen/Qwen3-0.6B", tmp_path / "q")
    assert folder == tmp_path / "q"
    repo_id, kwargs = calls[0]
    assert repo_id == "Qwen/Qwen3-0.6B"
    assert kwargs["endpoint"] == "https://mirror.example"
    assert {"config.json", "model.safetensors"} <= set(kwargs["allow_patterns"])


# --------------------------------------------------------------------------
# import-qwen3: an official folder -> the book's verified files
# --------------------------------------------------------------------------


def official_folder(path, kind="base", seed=12, **save_kwargs):
    """What `save_pretrained` writes for a (tiny, random, bf16) Qwen3 plus the
    Qwen3 tokenizer.json, i.e. the layout of Qwen/Qwen3-0.6B(-Base)."""
    from utils.download.standin import write_standin_tokenizer

    hf = random_hf_model(tied=True, seed=seed).to(torch.bfloat16)
    hf.config.eos_token_id = 151643 if kind == "base" else 151645
    hf.save_pretrained(path, **save_kwargs)
    write_standin_tokenizer(path / "tokenizer.json")
    (path / "tokenizer.json.STANDIN.json").unlink()  # a plain downloaded file
    return path


@pytest.mark.parametrize("kind", ["base", "reasoning"])
def test_import_qwen3_gives_verified_files_with_transformers_logits(
    tmp_path, kind, capsys, monkeypatch
):
    from reasoning_from_scratch import qwen3
    from reasoning_from_scratch.qwen3 import Qwen3Tokenizer

    from utils.download.fetch import download_qwen3_small
    from utils.download.provenance import is_verified

    src = official_folder(tmp_path / "src", kind, max_shard_size="100KB")
    out = tmp_path / "qwen3"
    # the command accepts Qwen3-0.6B only; here "0.6B" is the tiny config
    monkeypatch.setattr(qwen3, "QWEN_CONFIG_06_B", {**TINY, "dtype": torch.bfloat16})
    assert hf_interop.main(["import-qwen3", str(src), "--kind", kind,
                            "--out-dir", str(out)]) == 0  # fmt: skip
    assert f"qwen3-0.6B-{kind}.pth" in capsys.readouterr().out
    model_path = out / f"qwen3-0.6B-{kind}.pth"
    tok_path = out / f"tokenizer-{kind}.json"
    assert is_verified(model_path) and is_verified(tok_path)
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".json")) == [
        model_path.name
    ]  # no temporary files left behind

    sd = torch.load(model_path, weights_only=True)
    assert {v.dtype for v in sd.values()} == {torch.bfloat16}  # as the book's
    ours = book_model(sd, TINY)  # float32 copy of the same bf16 weights
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    ids = random_ids(seed=13)
    with torch.no_grad():
        assert_logits_close(ours(ids), hf.eval()(ids).logits)

    tok = Qwen3Tokenizer(tok_path)  # end of sequence follows the file name
    assert tok.eos_token_id == (151643 if kind == "base" else 151645)

    # The notebooks' download call now finds the files and makes no request.
    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # would fail if used
    files = download_qwen3_small(kind, out_dir=out)
    assert (files.model, files.standin) == (model_path, False)
    assert "already downloaded and verified" in capsys.readouterr().err


def test_import_into_the_store_serves_every_notebook_folder(
    tmp_path, capsys, monkeypatch
):
    """`--store`: one import, and the English and Chinese notebooks' qwen3/
    folders both get the files from the store, with no request."""
    import os

    from reasoning_from_scratch import qwen3

    from utils.download.fetch import download_qwen3_small

    src = official_folder(tmp_path / "src", "base", max_shard_size="100KB")
    store = tmp_path / "store"
    monkeypatch.setenv("QWEN3_MODEL_STORE", str(store))
    monkeypatch.chdir(tmp_path)  # where the default --out-dir would go
    monkeypatch.setattr(qwen3, "QWEN_CONFIG_06_B", {**TINY, "dtype": torch.bfloat16})
    argv = ["import-qwen3", str(src), "--kind", "base", "--store"]
    assert hf_interop.main(argv) == 0
    assert str(store / "qwen3-0.6B-base.pth") in capsys.readouterr().out
    assert not (tmp_path / "qwen3").exists()

    monkeypatch.delenv("QWEN3_STANDIN", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # would fail if used
    monkeypatch.setenv("QWEN3_BACKUP_URL", "http://127.0.0.1:9")
    for folder in ("nb/qwen3", "nb/zh/qwen3"):
        files = download_qwen3_small("base", out_dir=tmp_path / folder)
        assert files.model == tmp_path / folder / "qwen3-0.6B-base.pth"
        assert not files.standin
        assert os.path.samefile(files.model, store / "qwen3-0.6B-base.pth")

    with pytest.raises(SystemExit) as refused:
        hf_interop.main([*argv, "--out-dir", "x"])
    assert refused.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_import_replaces_standins_and_refuses_wrong_folders(
    tmp_path, capsys, monkeypatch
):
    from utils.download import provenance
    from utils.download.provenance import is_standin, is_verified
    from utils.download.standin import write_standin_weights

    src = official_folder(tmp_path / "src", "reasoning")
    out = tmp_path / "qwen3"
    stand_in = write_standin_weights(out / "qwen3-0.6B-base.pth", "base", TINY)
    assert is_standin(stand_in)
    # the install's content check expects the tiny model here, not 0.6B
    monkeypatch.setattr(provenance, "MODEL_CONFIG", TINY)

    with pytest.raises(ValueError, match="reasoning model.*--kind"):
        hf_interop.import_qwen3(src, "base", out, require_06b=False)
    with pytest.raises(ValueError, match="not Qwen3-0.6B.*emb_dim"):
        hf_interop.import_qwen3(src, "reasoning", out)  # the tiny model
    assert hf_interop.main(["import-qwen3", str(src), "--kind", "reasoning",
                            "--out-dir", str(out)]) == 2  # fmt: skip
    assert "not Qwen3-0.6B" in capsys.readouterr().err

    (src / "config.json").write_text(
        (src / "config.json").read_text().replace("151645", "151643")
    )
    (src / "tokenizer.json").rename(src / "tok.json")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        hf_interop.import_qwen3(src, "base", out, require_06b=False)
    (src / "tokenizer.json").write_text('{"added_tokens": []}')
    with pytest.raises(ValueError, match="not the Qwen3 tokenizer"):
        hf_interop.import_qwen3(src, "base", out, require_06b=False)
    assert is_standin(stand_in) and not is_verified(stand_in)  # untouched

    (src / "tok.json").replace(src / "tokenizer.json")
    hf_interop.import_qwen3(src, "base", out, require_06b=False)
    assert is_verified(stand_in) and not is_standin(stand_in)


def test_import_that_fails_midway_leaves_the_old_files(tmp_path, monkeypatch):
    from utils.download import provenance
    from utils.download.provenance import is_verified

    monkeypatch.setattr(provenance, "MODEL_CONFIG", TINY)  # content check: tiny
    src = official_folder(tmp_path / "src")
    out = tmp_path / "qwen3"
    files = hf_interop.import_qwen3(src, "base", out, require_06b=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    official_folder(tmp_path / "src2", seed=99)
    with pytest.raises(OSError, match="disk full"):
        hf_interop.import_qwen3(tmp_path / "src2", "base", out, require_06b=False)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert all(is_verified(p) for p in files)


def _import_fails_with_one_line(capsys, src, out, fragment):
    before = sorted(out.parent.iterdir())
    capsys.readouterr()  # what writing the folder printed
    rc = hf_interop.main(["import-qwen3", str(src), "--kind", "base",
                          "--out-dir", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("python -m utils.hf_interop: error: ")
    assert fragment in lines[0], lines[0]
    assert sorted(out.parent.iterdir()) == before  # nothing written


@pytest.mark.parametrize("cut", [8, 100, -200])
def test_import_of_a_truncated_safetensors_is_one_line(tmp_path, capsys, cut):
    src = official_folder(tmp_path / "src")
    weights = src / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:cut])
    out = tmp_path / "dest" / "qwen3"
    out.parent.mkdir()
    _import_fails_with_one_line(capsys, src, out, str(weights))


def test_import_with_a_config_that_is_not_an_object_is_one_line(tmp_path, capsys):
    src = official_folder(tmp_path / "src")
    (src / "config.json").write_text("[1, 2, 3]")
    out = tmp_path / "dest" / "qwen3"
    out.parent.mkdir()
    _import_fails_with_one_line(capsys, src, out, "config.json holds a JSON list")


def test_import_into_a_file_says_it_is_a_file(tmp_path, capsys):
    src = official_folder(tmp_path / "src")
    target = tmp_path / "dest" / "qwen3"
    target.parent.mkdir()
    target.write_text("not a folder")
    _import_fails_with_one_line(capsys, src, target, "is a file, not a folder")
    assert target.read_text() == "not a folder"


def test_import_tying_problem_is_said_in_command_terms(tmp_path, capsys):
    """A config saying "untied" beside weights without an lm_head: the hint
    names what to do with the folder, not a Python argument."""
    src = official_folder(tmp_path / "src")
    config = json.loads((src / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (src / "config.json").write_text(json.dumps(config))
    out = tmp_path / "dest" / "qwen3"
    out.parent.mkdir()
    _import_fails_with_one_line(capsys, src, out, "download it again")
    assert "tie_word_embeddings=True" not in capsys.readouterr().err


def _command_line(capsys, *args: str, env: dict[str, str] | None = None) -> str:
    """The one line of a failing import-qwen3 command (status 2)."""
    capsys.readouterr()  # what writing the source folder printed
    with pytest.MonkeyPatch.context() as patch:
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        rc = hf_interop.main(["import-qwen3", *args])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("python -m utils.hf_interop: error: ")
    return lines[0].removeprefix("python -m utils.hf_interop: error: ")


STORE_FIX = (
    "set QWEN3_MODEL_STORE to a folder of your own on a disk you can write to, "
    "or use --out-dir DIR instead of --store."
)
OUT_FIX = "choose, with --out-dir, a folder of your own on a disk you can write to."


@pytest.mark.skipif(
    os.name != "posix" or os.geteuid() != 0, reason="needs root (another user)"
)
def test_import_into_a_store_another_user_could_change_is_refused(tmp_path, capsys):
    """The rule of every folder files are kept in for later: nothing is
    written under another user's 0777 folder, before the source is read."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)
    shared.chmod(0o777)
    store = shared / "models"
    src = official_folder(tmp_path / "src")
    line = _command_line(capsys, str(src), "--kind", "base", "--store",
                         env={"QWEN3_MODEL_STORE": str(store)})  # fmt: skip
    assert line == (
        f"the model store {store} cannot be trusted ({shared} belongs to another "
        "user (uid 65534), so another user could replace the files there); "
        f"{STORE_FIX}"
    )
    assert list(shared.iterdir()) == []


def test_import_into_a_store_that_is_a_file_names_the_store(tmp_path, capsys):
    store = tmp_path / "models"
    store.write_text("a file")
    src = official_folder(tmp_path / "src")
    line = _command_line(capsys, str(src), "--kind", "base", "--store",
                         env={"QWEN3_MODEL_STORE": str(store)})  # fmt: skip
    assert line == f"the model store {store} is a file, not a folder; " + STORE_FIX


def test_import_into_a_read_only_disk_names_the_folder(tmp_path, capsys, tmpfs):
    disk = tmpfs("64k", "ro")
    src = official_folder(tmp_path / "src")
    for args, where, fix in (
        (["--store"], f"the model store {disk / 'models'}", STORE_FIX),
        (["--out-dir", str(disk)], f"--out-dir {disk}", OUT_FIX),
    ):
        env = {"QWEN3_MODEL_STORE": str(disk / "models")}
        line = _command_line(capsys, str(src), "--kind", "base", *args, env=env)
        assert line == f"cannot write into {where} (read-only file system); {fix}"


def test_import_into_a_folder_the_user_cannot_write_names_it(
    tmp_path, capsys, monkeypatch
):
    """Not the temporary folder the refusal came from."""
    import errno
    import tempfile

    def refused(dir, prefix):
        name = f"{dir}/{prefix}v4zdc7n8"
        raise PermissionError(errno.EACCES, "Permission denied", name)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", refused)
    out = tmp_path / "theirs"
    out.mkdir()
    src = official_folder(tmp_path / "src")
    line = _command_line(capsys, str(src), "--kind", "base", "--out-dir", str(out))
    assert line == f"cannot write into --out-dir {out} (permission denied); " + OUT_FIX


def test_import_onto_a_full_disk_names_the_folder_and_leaves_nothing(
    tmp_path, tmpfs, monkeypatch
):
    from utils.download import provenance

    monkeypatch.setattr(provenance, "MODEL_CONFIG", TINY)
    disk = tmpfs("64k")  # the tiny weights are ~4 MB
    src = official_folder(tmp_path / "src")
    with pytest.raises(hf_interop.DestinationError) as err:
        hf_interop.import_qwen3(src, "base", disk / "qwen3", require_06b=False)
    assert err.value.problem == (
        f"cannot write into {disk / 'qwen3'} (no space left on the disk)"
    )
    assert list(disk.iterdir()) == []


@pytest.mark.parametrize("tied", [True, False])
def test_import_of_weights_that_do_not_fit_their_config_names_the_folder(
    tmp_path, capsys, tied
):
    """Tiny tensors beside Qwen3-0.6B's config.json: the shapes are the
    problem, whatever the config says about tying."""
    src = official_folder(tmp_path / "src")
    config = {**QWEN3_06B_CONFIG_JSON, "eos_token_id": 151643}
    config["tie_word_embeddings"] = tied
    (src / "config.json").write_text(json.dumps(config))
    line = _command_line(capsys, str(src), "--kind", "base")
    assert line.startswith(
        f"the weights in {src} do not fit its config.json (tok_emb.weight has "
        f"shape ({TINY['vocab_size']}, {TINY['emb_dim']}), expected (151936, 1024)"
    )
    assert line.endswith(
        "they are another model's; download the folder again, from "
        "Qwen/Qwen3-0.6B-Base or Qwen/Qwen3-0.6B."
    )


def test_import_of_a_book_pth_file_says_it_needs_no_conversion(tmp_path, capsys):
    pth = tmp_path / "qwen3-0.6B-base.pth"
    pth.write_bytes(b"weights")
    official = (
        "give the folder of an official Qwen3 download (config.json, "
        "tokenizer.json and the *.safetensors files)."
    )
    line = _command_line(capsys, str(pth), "--kind", "base")
    assert line == (
        f"{pth} is a .pth file, the book's own format: it needs no conversion "
        f"(the commands take it with --model-file); {official}"
    )
    missing = tmp_path / "Qwen3-0.6B-Base"
    line = _command_line(capsys, str(missing), "--kind", "base")
    assert line == f"{missing} does not exist; {official}"


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every entry of `folder` (hidden ones too): bytes and mtime."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def _small_vocabulary(src: Path) -> Path:
    """Make `src`'s tokenizer.json keep Qwen3's added tokens but hold a
    2-entry vocabulary (what the book's content check refuses)."""
    path = src / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["model"]["vocab"] = {"a": 0, "b": 1}
    path.unlink()  # a new file: this one may be a link to the stand-in cache
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_a_failed_import_leaves_a_verified_pair_as_it_was(
    tmp_path, capsys, monkeypatch
):
    from reasoning_from_scratch import qwen3

    from utils.download import provenance
    from utils.download.provenance import is_verified

    monkeypatch.setattr(provenance, "MODEL_CONFIG", TINY)  # content check: tiny
    out = tmp_path / "qwen3"
    files = hf_interop.import_qwen3(official_folder(tmp_path / "src"), "base", out,
                                    require_06b=False)  # fmt: skip
    before = _snapshot(out)
    bad = _small_vocabulary(official_folder(tmp_path / "src2", seed=99))
    # the command takes Qwen3-0.6B only; here "0.6B" is the tiny config
    monkeypatch.setattr(qwen3, "QWEN_CONFIG_06_B", {**TINY, "dtype": torch.bfloat16})
    capsys.readouterr()
    rc = hf_interop.main(["import-qwen3", str(bad.parent), "--kind", "base",
                          "--out-dir", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert f"{bad} is not the Qwen3 tokenizer (vocabulary has 2 entries" in err
    assert _snapshot(out) == before  # same files, bytes and times
    assert all(is_verified(p) for p in files)


@pytest.mark.parametrize("there", ["absent", "empty"])
def test_a_failed_import_into_a_new_folder_leaves_it_as_it_was(
    tmp_path, monkeypatch, there
):
    from utils.download import provenance

    monkeypatch.setattr(provenance, "MODEL_CONFIG", TINY)
    bad = _small_vocabulary(official_folder(tmp_path / "src"))
    out = tmp_path / "dest" / "qwen3"
    if there == "empty":
        out.mkdir(parents=True)
    with pytest.raises(ValueError, match="vocabulary has 2 entries"):
        hf_interop.import_qwen3(bad.parent, "base", out, require_06b=False)
    if there == "empty":
        assert list(out.iterdir()) == []
    else:
        assert not (tmp_path / "dest").exists()


def test_an_import_failing_while_placing_puts_the_old_files_back(tmp_path, monkeypatch):
    import utils.download  # the door the importer calls through
    from utils.download import provenance
    from utils.download.provenance import is_verified

    monkeypatch.setattr(provenance, "MODEL_CONFIG", TINY)
    out = tmp_path / "qwen3"
    files = hf_interop.import_qwen3(official_folder(tmp_path / "src"), "base", out,
                                    require_06b=False)  # fmt: skip
    (out / "notes.txt").write_text("the reader's own file")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_record = provenance.write_record
    calls = []

    def failing_second_record(path, info):
        calls.append(path)
        if len(calls) == 2:  # the weights are in place, the tokenizer not yet
            raise OSError("disk full")
        write_record(path, info)

    monkeypatch.setattr(utils.download, "write_record", failing_second_record)
    with pytest.raises(OSError, match="disk full"):
        hf_interop.import_qwen3(official_folder(tmp_path / "src2", seed=99), "base",
                                out, require_06b=False)  # fmt: skip
    monkeypatch.setattr(utils.download, "write_record", write_record)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert all(is_verified(p) for p in files)  # (checked again: renamed back)


def test_export_to_a_link_is_refused_in_one_line(tmp_path):
    """A link named as out_dir is neither replaced (it is the reader's) nor
    written through (its folder may be someone else's): one line, nothing
    written, even with overwrite=True."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    link = tmp_path / "hf"
    link.symlink_to(elsewhere)
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="symbolic link") as info:
            export_hf_folder(tied_standin(10), TINY, link, overwrite=overwrite,
                             **NO_IDS)  # fmt: skip
        assert len(str(info.value).splitlines()) == 1
        assert str(elsewhere) in str(info.value)  # the folder to name instead
    assert link.is_symlink() and os.readlink(link) == str(elsewhere)
    assert [p.name for p in elsewhere.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "hf"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_export_folder_and_files_follow_the_umask(tmp_path, umask):
    """model.safetensors was 0600 (safetensors' own mode) beside 0644 files:
    a server running as another user could not read the weights."""
    old = os.umask(umask)
    try:
        out = export_hf_folder(tied_standin(10), TINY, tmp_path / "hf",
                               tokenizer_file=None, **NO_IDS)  # fmt: skip
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    names = sorted(p.name for p in out.iterdir())
    assert "model.safetensors" in names and "config.json" in names
    for name in names:
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o666 & ~umask, name


KILLED_EXPORT = r"""
import os, sys, time
from pathlib import Path
from tests.test_hf_interop import NO_IDS, TINY, tied_standin
from utils.hf_interop import convert as hf_interop

def stuck_save(tensors, filename, metadata=None):
    Path(filename).write_bytes(b"half of the weights")
    print("writing", flush=True)
    time.sleep(600)

hf_interop.save_file = stuck_save
hf_interop.export_hf_folder(tied_standin(10), TINY, sys.argv[1], **NO_IDS)
"""


@pytest.mark.slow  # a subprocess
def test_an_export_killed_midway_is_cleaned_up_by_the_next(tmp_path):
    """SIGKILL leaves the hidden temporary folder (nothing can run then);
    the next export to that folder removes it: its process is gone."""
    import signal
    import subprocess
    import sys

    target = tmp_path / "hf"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_EXPORT, str(target)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    try:
        assert proc.stdout.readline() == "writing\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".hf.tmp-")]
    assert len(left) == 1 and f"-{proc.pid}-" in left[0].name
    export_hf_folder(tied_standin(10), TINY, target, **NO_IDS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert (target / "model.safetensors").stat().st_size > 1000
