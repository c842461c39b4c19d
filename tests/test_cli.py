import pytest

from schedrl.cli import main


def test_demo_runs_and_reports_a_speedup(capsys):
    assert main(["engine-demo", "--requests", "64", "--concurrency", "8"]) == 0
    out = capsys.readouterr().out
    assert "static batching" in out and "continuous batching" in out
    assert "x the tokens/s of static batching" in out


def test_unknown_task_is_a_clear_error(capsys):
    assert main(["engine-demo", "--task", "nope", "--requests", "4"]) == 2
    out = capsys.readouterr().out
    assert "unknown task 'nope'" in out and "longtail" in out


def test_make_tiny_then_demo_from_the_directory(tmp_path, capsys):
    assert main(["make-tiny", str(tmp_path / "tiny")]) == 0
    assert (
        main(["engine-demo", "--requests", "16", "--concurrency", "4", "--model", str(tmp_path / "tiny")])
        == 0
    )


def test_model_directory_without_tokenizer(tmp_path, capsys):
    main(["make-tiny", str(tmp_path / "tiny")])
    (tmp_path / "tiny" / "tokenizer.json").unlink()
    (tmp_path / "tiny" / "tokenizer_config.json").unlink()
    assert main(["engine-demo", "--requests", "4", "--model", str(tmp_path / "tiny")]) == 2
    assert "has no tokenizer" in capsys.readouterr().out


def test_tasks_preview(capsys):
    assert main(["tasks", "countdown", "-n", "3"]) == 0
    assert "cd:" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["engine-demo", "--requests", "x"], ["nope"]])
def test_bad_arguments_exit_nonzero(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code != 0


def test_list_algos_shows_every_registered_name(capsys):
    from schedrl.algos import registry

    assert main(["list", "algos"]) == 0
    out = capsys.readouterr().out
    for kind in ("loss", "advantage"):
        for name, description in registry.available(kind).items():
            assert name in out and description.split()[0] in out
