"""Figures 1-4 and 6 in a real browser: each renders, its controls change what it shows, the KV
animation plays to the summary table and that table is `inferlab simulate --json`'s; screenshots
of every figure at desktop and phone width go to tests/web/artifacts/."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _pagekit import DESKTOP, PHONE, open_page, settle, shoot

FIGURES = ["fig-load", "fig-token", "fig-phases", "fig-roofline", "fig-calc", "fig-kv"]


def cli_simulate(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "inferlab.cli.main", "simulate", *args, "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def kv_summary(page) -> dict[str, dict[str, float | None]]:
    cells = page.locator("#fig-kv [data-testid=kv-summary] [data-value]")
    out: dict[str, dict] = {}
    for i in range(cells.count()):
        c = cells.nth(i)
        _, engine, key = c.get_attribute("data-testid").split("-", 2)
        v = c.get_attribute("data-value")
        out.setdefault(engine, {})[key] = None if v == "" else float(v)
    return out


def test_kv_animation_plays_to_the_summary_and_equals_inferlab_simulate(page):
    settle(page, "fig-kv")
    assert page.locator("#fig-kv [data-testid=kv-summary]").count() == 0  # starts at step 1
    first = page.locator("#fig-kv [data-testid=kv-step-label]").inner_text()
    assert first.startswith("step 1 of ")
    page.locator("#fig-kv [data-act=play]").click()
    page.wait_for_selector("#fig-kv [data-testid=kv-summary]", timeout=30000)  # played to the end
    want = {r["engine"]: r["summary"] for r in cli_simulate("--workload", "seed-chat", "--capacity-tokens", "384")["runs"]}
    got = kv_summary(page)
    assert set(got) == {"llamacpp", "vllm", "sglang"}
    for engine, row in got.items():
        for key, v in row.items():
            assert v == want[engine][key], (engine, key)
    # each engine panel shows its own final step: KV in use drops to 0 when every request is done
    for engine in got:
        assert "0 in use" in page.locator(f"#fig-kv [data-testid=kv-engine-{engine}]").inner_text()


def test_kv_step_shows_blocks_with_hashes_and_locked_tree_nodes(page):
    settle(page, "fig-kv")
    slider = page.locator("#fig-kv input[name=kv_step]")
    slider.evaluate("(e) => { e.value = '30'; e.dispatchEvent(new Event('input', {bubbles: true})); }")  # step 31: user0's second turn runs
    assert page.locator("#fig-kv [data-testid=kv-step-label]").inner_text().startswith("step 31 of 48")
    vllm = page.locator("#fig-kv [data-testid=kv-engine-vllm]")
    titles = [c.get_attribute("title") for c in vllm.locator(".cell.big").all()]
    assert len(titles) == 384 // 16 + 1 and titles[0].startswith("block 0")
    assert any("hash" in t and "held by user0-turn2" in t for t in titles)  # its prefix blocks, found by hash
    assert any("cached, free to reuse" in t for t in titles)
    sglang = page.locator("#fig-kv [data-testid=kv-engine-sglang]")
    assert "locked by user0-turn2" in sglang.locator(".node.locked").first.get_attribute("title")
    assert "step 31 of 48" in sglang.inner_text()


def test_kv_controls_change_the_run(page):
    settle(page, "fig-kv")
    pool = page.locator("#fig-kv input[name=capacity_tokens]")
    pool.fill("128")
    pool.dispatch_event("change")
    settle(page, "fig-kv")
    page.locator("#fig-kv [data-act=end]").click()
    got = kv_summary(page)
    want = {r["engine"]: r["summary"] for r in cli_simulate("--workload", "seed-chat", "--capacity-tokens", "128")["runs"]}
    assert got["vllm"]["kv_capacity_tokens"] == 128
    assert got["vllm"]["prefill_computed"] == want["vllm"]["prefill_computed"]
    assert got["sglang"]["peak_concurrency"] == want["sglang"]["peak_concurrency"]
    # step buttons: one back from the end hides the summary again
    page.locator("#fig-kv [data-act=prev]").click()
    assert page.locator("#fig-kv [data-testid=kv-summary]").count() == 0


def trace_json(*args: str) -> dict:
    p = subprocess.run([sys.executable, "-m", "inferlab.cli.main", "trace", *args, "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


def values(page, sel: str) -> list[float]:
    return [float(x.get_attribute("data-value")) for x in page.locator(sel).all()]


def test_loading_steps_fill_the_memory_tiers(page):
    fig = "#fig-load"
    settle(page, "fig-load")
    label = page.locator(f"{fig} [data-testid=load-step-label]")
    assert label.inner_text().startswith("Step 1 of 8: read header")  # the partial-offload scenario
    vram = page.locator(f"{fig} [data-testid=load-tier-1]")
    assert "weights not yet" in vram.inner_text()
    page.locator(f"{fig} [data-act=next]").click()
    page.locator(f"{fig} [data-act=next]").click()  # mmap, then the copy over PCIe
    assert label.inner_text().startswith("Step 3 of 8: copy 42 blocks + output head to RTX 4060 Ti")
    assert "weights resident" in vram.inner_text() and "KV not yet" in vram.inner_text()
    assert "weights mapped" in page.locator(f"{fig} [data-testid=load-tier-0]").inner_text()  # RAM: mmap'd, not read
    first = float(page.locator(f"{fig} [data-testid=load-total-s]").get_attribute("data-value"))
    second = float(page.locator(f"{fig} [data-testid=load-second-s]").get_attribute("data-value"))
    assert second < first  # the second launch finds the file in the page cache
    # the lesson's Apple scenario: nothing crosses a PCIe link
    page.locator(f"{fig} select[name=scenario]").select_option("apple")
    settle(page, "fig-load")
    assert "PCIe" not in page.locator(f"{fig} .steps").inner_text()
    assert "(unified)" in page.locator(f"{fig} [data-testid=load-tier-1]").inner_text()


def test_time_per_token_falls_with_context_and_kv_type_changes_it(page):
    fig = "#fig-token"
    settle(page, "fig-token")
    f16 = values(page, f"{fig} [data-testid=token-tok-s-f16]")
    q8 = values(page, f"{fig} [data-testid=token-tok-s-q8_0]")
    assert len(f16) >= 5 and f16 == sorted(f16, reverse=True) and f16[-1] < 0.6 * f16[0]
    assert q8[0] == f16[0] and q8[-1] > f16[-1]  # no cache to read at 0 tokens; a q8_0 cache is fewer bytes
    now = float(page.locator(f"{fig} [data-testid=token-now]").get_attribute("data-value"))
    slider = page.locator(f"{fig} input[name=context]")
    slider.focus()
    page.keyboard.press("End")  # the whole 64k cache
    settle(page, "fig-token")
    later = float(page.locator(f"{fig} [data-testid=token-now]").get_attribute("data-value"))
    want = trace_json("decode", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "65536", "--context", "65536")
    assert later == want["tok_per_s"] and later < now


def test_phases_step_through_both_scenarios(page):
    fig = "#fig-phases"
    settle(page, "fig-phases")
    label = page.locator(f"{fig} [data-testid=phase-step-label]")
    assert label.inner_text() == "Step 1 of 5: prefill micro-batch 1 of 4"  # 2,000 tokens in micro-batches of 512
    assert "op offload" in page.locator(f"{fig} [data-testid=phase-steps]").inner_text()
    partial = float(page.locator(f"{fig} [data-testid=phase-decode-tok]").get_attribute("data-value"))
    for _ in range(4):
        page.locator(f"{fig} [data-act=next]").click()
    assert label.inner_text() == "Step 5 of 5: one decode step"
    assert "read weights" in page.locator(f"{fig} [data-testid=phase-steps]").inner_text()
    page.locator(f"{fig} select[name=scenario]").select_option("fits")
    settle(page, "fig-phases")
    fits = float(page.locator(f"{fig} [data-testid=phase-decode-tok]").get_attribute("data-value"))
    assert fits > 3 * partial  # an 8B model on a 4090 against a 32B model partly in system RAM
    want = trace_json("decode", "llama-3.1-8b", "--on", "rtx4090", "--ctx", "8192", "--context", "2000")
    assert fits == want["tok_per_s"]


def test_roofline_batch_moves_decode_up_the_slope(page):
    fig = "#fig-roofline"
    settle(page, "fig-roofline")
    ridge = float(page.locator(f"{fig} [data-testid=roof-ridge]").get_attribute("data-value"))
    assert ridge == pytest.approx(165.2e12 / 1008e9)  # RTX 4090: 165.2 TFLOP/s over 1,008 GB/s (vendor figures)
    i1 = float(page.locator(f"{fig} [data-testid=roof-decode-intensity]").get_attribute("data-value"))
    slider = page.locator(f"{fig} input[name=batch]")
    slider.evaluate("(e) => { e.value = '64'; e.dispatchEvent(new Event('input', {bubbles: true})); }")
    settle(page, "fig-roofline")
    i64 = float(page.locator(f"{fig} [data-testid=roof-decode-intensity]").get_attribute("data-value"))
    assert i64 == pytest.approx(64 * i1)  # weights read once for the batch: intensity grows with it
    assert float(page.locator(f"{fig} [data-testid=roof-tok]").get_attribute("data-value")) > 0


def test_provenance_on_hover(page):
    settle(page, "fig-calc")
    n = page.locator("#fig-calc [data-testid=calc-decode]")
    n.hover()
    tip = page.locator("#tip")
    assert tip.is_visible() and tip.inner_text().startswith("estimated:") and "speed model" in tip.inner_text()
    cap = page.locator("#fig-calc [data-testid^=mem-cap-]").first
    cap.focus()  # keyboard users get the same
    assert "catalog" in tip.inner_text() and "1024 MiB" in tip.inner_text()


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_every_figure_renders_and_is_saved(browser, server, size):
    page = open_page(browser, server, DESKTOP if size == "desktop" else PHONE)
    try:
        for fig in FIGURES:
            settle(page, fig)
            out = page.locator(f"#{fig} .out")
            assert out.inner_text().strip(), f"{fig} drew nothing"
            assert not page.locator(f"#{fig} .error").is_visible(), page.locator(f"#{fig} .error").inner_text()
            note = page.locator(f"#{fig} .note").inner_text()
            assert "stimate" in note or "imulated" in note
            # readable at this width: nothing wider than the viewport
            overflow = page.evaluate(f"() => document.querySelector('#{fig}').scrollWidth - document.querySelector('#{fig}').clientWidth")
            assert overflow <= 1, f"{fig} overflows by {overflow} px at {size} width"
            if fig == "fig-kv":
                page.locator("#fig-kv [data-act=end]").click()
            path = shoot(page, fig, f"{fig}-{size}")
            assert path.stat().st_size > 5000
        assert page.evaluate("() => document.documentElement.scrollWidth") <= page.viewport_size["width"]
        assert page.js_errors == []
    finally:
        page.context.close()
