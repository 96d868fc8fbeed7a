"""Ablation sweeps: a config's arms x seeds, run here or on a cluster, then a report.

`plan` turns a config's sweep into runs and their commands, `launch` runs them
(resumably, in parallel), `report` tabulates and plots their results, `cli` is the
command line.

A config file (`configs/X.py`) defines, next to `get_config(arg=None)`,

    def sweep(name) -> list[dict]:   # [{"name": "kl0", "overrides": {"algo.kl_coef": 0.0}}, ...]

Each arm is crossed with the seeds (`seed` and `data.world_seed` set to each seed) into
runs. A run is one `scripts/train.py` process with its own workdir
`<out>/<arm>/seed<seed>`; it writes `metrics.jsonl` while training and `final.json`
(flat final numbers) when done, so a run with a final.json is finished and a sweep can
be resumed by starting it again. `scripts/sweep.py` is the command line
(`agentjax.sweep.cli`):

    python scripts/sweep.py --config configs/grpo_search.py --sweep group_size \
        --seeds 0,1,2 --parallel 2 --out runs/group_size

The report (`<out>/report.md`) tabulates the final metrics per arm (mean ± sample std
over seeds, and every seed's value) and plots training curves per arm (mean over seeds,
min-max band) as PNGs. For the experiment trackers a run turns on (log.wandb,
log.mlflow), each run is named `<arm>/seed<seed>`, grouped by the sweep
(`<config>-<sweep>`) and tagged by its arm and override values (`plan.tracking_overrides`),
so the trackers' own views line the arms up.
"""
