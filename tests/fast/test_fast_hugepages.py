"""utils.fast.hugepages: the weights a native step streams get memory of
their own on 2 MB pages, in place (same Parameters, same values), and the
old memory is paged out only where it is a checkpoint's file mapping."""

from __future__ import annotations

import pytest
import torch

import utils.fast.build as build
import utils.fast.hugepages as hugepages
from tests.memory_maps import vm_flags
from tests.tiny import tiny_config, tiny_state_dict
from utils.fast import FastQwen3, decode_one_token, prefill
from utils.models import load_book_model

HUGE = 2 << 20


@pytest.fixture
def advice(monkeypatch):
    """madvise calls recorded (not made); huge pages reported on"""
    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(hugepages, "madvise", lambda *a: calls.append(a))
    monkeypatch.setattr(hugepages, "huge_pages_enabled", lambda: True)
    return calls


def linears() -> torch.nn.Module:
    big = torch.nn.Linear(1024, 1024, bias=False, dtype=torch.bfloat16)  # 2 MB
    tied = torch.nn.Linear(1024, 1024, bias=False, dtype=torch.bfloat16)
    tied.weight = big.weight  # one Parameter in two modules
    small = torch.nn.Linear(64, 64, bias=False, dtype=torch.bfloat16)
    wide = torch.nn.Linear(3072, 1024, bias=False, dtype=torch.bfloat16)  # 6 MB
    return torch.nn.ModuleList([big, tied, small, wide])


def test_large_weights_move_in_place_onto_advised_2mb_pages(advice):
    model = linears()
    params = [m.weight for m in model]
    values = [p.detach().clone() for p in params]
    small_at = model[2].weight.data_ptr()
    assert hugepages.move_weights_to_huge_pages(model) == HUGE + 3 * HUGE
    assert [m.weight for m in model] == params  # the same Parameter objects
    assert model[1].weight is model[0].weight  # still shared, moved once
    for p, v in zip(params, values, strict=True):
        assert torch.equal(p, v)
    assert model[2].weight.data_ptr() == small_at  # under 2 MB: stays
    big, wide = model[0].weight.data_ptr(), model[3].weight.data_ptr()
    assert big % HUGE == 0 and wide % HUGE == 0
    assert sorted(advice) == sorted(
        [
            (big, HUGE, hugepages.MADV_HUGEPAGE),
            (wide, 3 * HUGE, hugepages.MADV_HUGEPAGE),
        ]
    )  # advised, and nothing paged out: the old memory was not a file's
    advice.clear()
    assert hugepages.move_weights_to_huge_pages(model) == 0  # already there
    assert advice == []


def test_weights_moved_in_inference_mode_stay_normal_tensors(advice):
    model = linears()
    with torch.inference_mode():
        assert hugepages.move_weights_to_huge_pages(model) > 0
    assert not model[0].weight.is_inference()
    model[0](torch.ones(1, 1024, dtype=torch.bfloat16)).sum().backward()
    assert model[0].weight.grad is not None  # usable outside inference mode


def test_nothing_moves_where_huge_pages_are_off(monkeypatch):
    monkeypatch.setattr(hugepages, "huge_pages_enabled", lambda: False)
    model = linears()
    before = [m.weight.data_ptr() for m in model]
    assert hugepages.move_weights_to_huge_pages(model) == 0
    assert [m.weight.data_ptr() for m in model] == before


def test_huge_pages_are_off_off_linux_and_when_set_to_never(monkeypatch, tmp_path):
    setting = tmp_path / "enabled"
    monkeypatch.setattr(hugepages, "THP_SETTING", setting)
    setting.write_text("always madvise [never]\n")
    assert not hugepages.huge_pages_enabled()
    setting.write_text("always [madvise] never\n")
    assert hugepages.huge_pages_enabled() == hugepages.sys.platform.startswith("linux")
    monkeypatch.setattr(hugepages.sys, "platform", "darwin")
    assert not hugepages.huge_pages_enabled()


def test_weights_mapped_from_a_checkpoint_are_paged_out_as_copied(
    advice, tmp_path, monkeypatch
):
    monkeypatch.setattr(hugepages, "COPY_CHUNK", 1 << 20)  # 512 rows a chunk
    path = tmp_path / "w.pth"
    torch.save({"w": torch.randn(2048, 1024).to(torch.bfloat16)}, path)
    mapped = torch.load(path, weights_only=True, mmap=True)["w"]
    linear = torch.nn.Linear(1024, 2048, bias=False, dtype=torch.bfloat16)
    linear.weight = torch.nn.Parameter(mapped, requires_grad=False)
    hugepages.move_weights_to_huge_pages(linear)
    assert torch.equal(linear.weight, mapped)
    spans = [a[:2] for a in advice if a[2] == hugepages.MADV_PAGEOUT]
    assert len(spans) == 4  # one per 1 MB chunk, in order, covering it all
    start, end = mapped.data_ptr(), mapped.data_ptr() + 2 * HUGE  # 4 MB
    assert spans[0][0] <= start and spans[-1][0] + spans[-1][1] >= end
    for (a, n), (b, _) in zip(spans, spans[1:], strict=False):
        assert a < b <= a + n


def test_the_kernel_marks_moved_weights_for_huge_pages(madvised_huge_pages):
    model = linears()
    hugepages.move_weights_to_huge_pages(model)
    flags = vm_flags(model[3].weight.data_ptr())
    assert flags is not None and "hg" in flags, flags


@pytest.mark.skipif(
    build.unsupported_reason() is not None,
    reason="the native step needs the C kernels (x86-64 with AVX2, or AArch64)",
)
def test_the_native_step_moves_the_books_weights_and_keeps_its_results(monkeypatch):
    # a head of 1024 x 1024 bf16 (2 MB), tied to the embedding as in Qwen3
    cfg = tiny_config(emb_dim=1024, vocab_size=1024, dtype=torch.bfloat16)
    sd = tiny_state_dict(3, cfg)
    sd.pop("out_head.weight", None)

    def run(enabled: bool) -> tuple[torch.nn.Module, FastQwen3, list]:
        monkeypatch.setattr(hugepages, "huge_pages_enabled", lambda: enabled)
        book = load_book_model({k: v.clone() for k, v in sd.items()}, cfg=cfg)
        fast = FastQwen3.from_book_model(book)
        assert fast.use_native_step()
        fast.setup_cache(1, 16)
        with torch.inference_mode():
            tok, _ = prefill(fast, torch.tensor([[1, 2, 3]]))
            out = []
            for pos in range(3, 9):
                tok, logits = decode_one_token(fast, tok, torch.tensor([pos]))
                out.append(logits)
        return book, fast, out

    _, _, plain = run(False)
    book, fast, moved = run(True)
    head = fast.out_head.weight
    assert head.data_ptr() % HUGE == 0 and head is fast.tok_emb.weight
    assert book.out_head.weight.data_ptr() == head.data_ptr()  # the book's too
    for a, b in zip(plain, moved, strict=True):
        assert torch.equal(a, b)
