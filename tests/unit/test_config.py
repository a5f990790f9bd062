"""Option parsing: one place, clear errors."""

import pytest

from ddprof_nb.config import SamplerConfig, parse_duration_ns, parse_size_bytes


@pytest.mark.parametrize("text,ns", [("10ms", 10_000_000), ("250us", 250_000), ("1s", 10**9), (0.01, 10_000_000), ("1.5ms", 1_500_000)])
def test_durations(text, ns):
    assert parse_duration_ns(text) == ns


@pytest.mark.parametrize("bad", ["10", "ten ms", "-1ms", "0ms", True, "5 parsecs"])
def test_bad_durations_name_the_value(bad):
    with pytest.raises(ValueError, match="invalid interval"):
        parse_duration_ns(bad)


@pytest.mark.parametrize("text,n", [("512KiB", 524288), ("1MB", 10**6), ("4096", 4096), (100, 100), ("1.5MiB", 1572864)])
def test_sizes(text, n):
    assert parse_size_bytes(text) == n


@pytest.mark.parametrize("bad", ["1 parsec", "-5", "0", "KiB"])
def test_bad_sizes(bad):
    with pytest.raises(ValueError, match="invalid alloc rate"):
        parse_size_bytes(bad)


def test_make_validates_everything():
    cfg = SamplerConfig.make(events="cpu", interval="1ms", labels={"a": 1})
    assert cfg.interval_ns == 1_000_000 and cfg.labels == (("a", "1"),)
    with pytest.raises(ValueError, match="between 100us and 60s"):
        SamplerConfig.make(interval="1us")
    with pytest.raises(ValueError, match="invalid engine"):
        SamplerConfig.make(engine="turbo")
    with pytest.raises(ValueError, match="max_depth"):
        SamplerConfig.make(max_depth=0)


def test_asyncio_mode_is_validated_and_survives_the_spec_round_trip():
    assert SamplerConfig.make().asyncio == "fold"
    for mode in ("fold", "raw", "off"):
        cfg = SamplerConfig.make(asyncio=mode, labels={"a": "1"}, events="cpu,park")
        assert SamplerConfig.from_spec(cfg.to_spec()) == cfg
    with pytest.raises(ValueError, match="asyncio mode 'yes'.*fold, raw, off"):
        SamplerConfig.make(asyncio="yes")
    # a spec from an older parent (no asyncio key) means the default
    spec = SamplerConfig.make().to_spec()
    del spec["asyncio"]
    assert SamplerConfig.from_spec(spec).asyncio == "fold"


def test_profile_hands_every_option_to_the_config_by_name(monkeypatch):
    # GIVEN profile() with every option that reaches the config set away from its default
    import ddprof_nb
    from ddprof_nb import sampler as sampler_mod

    made = []
    monkeypatch.setattr(sampler_mod.Sampler, "start", lambda self, **kw: made.append(self.config) or self)
    monkeypatch.setattr(sampler_mod.Sampler, "stop", lambda self, steps=(): None)
    options = dict(events="wall,alloc", interval="5ms", alloc_rate="1MiB", native_alloc=False, engine="python",
                   max_depth=33, labels={"run": "a"}, asyncio="off", native=True)
    # WHEN the block runs
    with ddprof_nb.profile(**options):
        pass
    # THEN the session's config is the one SamplerConfig.make gives for the same options
    assert made == [SamplerConfig.make(**options)]
    # AND max_depth left out is the default depth
    with ddprof_nb.profile(events="wall", engine="python"):
        pass
    assert made[-1].max_depth == SamplerConfig().max_depth


def test_a_sampler_takes_a_config_or_options_and_profiled_checks_them_when_decorating():
    from ddprof_nb import Sampler, profiled

    with pytest.raises(TypeError, match="not both"):
        Sampler(SamplerConfig.make(), events="cpu")
    assert Sampler(events="wall", interval="2ms").config == SamplerConfig.make(events="wall", interval="2ms")
    with pytest.raises(ValueError, match="invalid interval"):
        profiled(interval="ten ms")(lambda: None)
