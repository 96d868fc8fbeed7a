"""scripts/export_hf.py writes only where an export may replace the folder as a whole:
a missing or empty folder, or an earlier export (its marker file); with LoRA, the
adapter folder beside it too."""
from agentjax.train.policy import ADAPTER_DIR, EXPORT_MARKER, export_folders, export_refusal


def test_an_export_replaces_only_a_missing_or_empty_folder_or_an_earlier_export(tmp_path):
    out = tmp_path / "policy"
    assert export_refusal(str(out), lora=False) is None
    out.mkdir()
    assert export_refusal(str(out), lora=False) is None
    for name in ("notes.txt", "a", "b", "c", "d", "e"):
        (out / name).write_text("mine")
    assert export_refusal(str(out), lora=False) == (
        f"an export replaces its folder as a whole, and {out} holds a, b, c, d, e and 1 "
        f"more and is no earlier export (it has no {EXPORT_MARKER}): choose a missing "
        "or empty folder")
    (out / EXPORT_MARKER).write_text("{}")
    assert export_refusal(str(out), lora=False) is None
    (tmp_path / "file").write_text("")
    assert f"{tmp_path / 'file'} is a file" in export_refusal(str(tmp_path / "file"),
                                                              lora=False)


def test_a_lora_export_also_checks_the_adapter_folder_beside_it(tmp_path):
    out = tmp_path / "policy"
    assert export_folders(f"{out}/", lora=True) == [str(out), str(tmp_path / ADAPTER_DIR)]
    (tmp_path / ADAPTER_DIR).mkdir()
    (tmp_path / ADAPTER_DIR / "mine.safetensors").write_text("")
    assert export_refusal(str(out), lora=False) is None
    assert f"{tmp_path / ADAPTER_DIR} holds mine.safetensors" in export_refusal(
        str(out), lora=True)
