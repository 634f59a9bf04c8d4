"""The agent's staging phases: the local disk, the GPU check, the model, the trainer's sources and the
dataset on this host, each a boot phase whose failure is this host's (the controller tries another
offer). A part of the Agent class (agent.py), which runs them in this order.
"""

from __future__ import annotations

import logging
from pathlib import Path

from . import gpu, nvme, staging
from .outcome import Failure
from .store import StoreError, open_store, retry

log = logging.getLogger("sdcloud_agent")


class StagingPhases:
    def _prepare_disk(self) -> None:
        mount = self.cfg.mount_point
        if mount is None:
            return
        path, p = nvme.setup(mount)
        if path is not None:
            # Everything bulky (dataset, checkpoints) goes on the fast local disk.
            self.workdir = path / "sdcloud" / self.cfg.run_id
            self.workdir.mkdir(parents=True, exist_ok=True)
            log.info("working on local NVMe: %s", self.workdir)

    def _check_gpu(self) -> None:
        gpus = gpu.query()
        self.gpu_count = len(gpus)
        for g in gpus:
            log.info("GPU: %s, %.1f GB, driver %s", g.name, g.vram_gb, g.driver)
        res = gpu.check(gpus, self.cfg.min_vram_gb, self.cfg.rec_vram_gb, self.cfg.require_gpu)
        for w in res.warnings:
            log.warning(w)
        if not res.ok:
            raise Failure(res.reason, boot_phase="gpu")

    def _stage(self) -> Path | None:
        if not self.cfg.dataset:
            return None
        self.status.set_phase("staging")
        opts = {k: v for k, v in self.cfg.store.items() if k != "url"}
        try:
            with self.phases.phase("dataset"):
                return staging.stage(self.cfg.dataset, self.workdir / "dataset", opts).path
        except (StoreError, OSError) as exc:
            raise Failure(f"staging the dataset failed: {exc}", boot_phase="dataset") from exc

    def _stage_model(self) -> str:
        """The base model from the bucket's cache/models/ (fetched and cached once), on local disk."""
        from . import models

        # The local and SSH hosts: the trainer reads the model as given, but for a local model the
        # controller uploaded (a `cache:` reference), which every host restores from the bucket.
        if not self.phases.enabled and not models.is_cache_ref(self.cfg.model):
            return self.cfg.model

        try:
            with self.phases.phase("model") as ph:
                args = self.cfg.trainer_args if isinstance(self.cfg.trainer_args, dict) else {}
                # kohya's SD3 scripts read the single-file checkpoint, not the diffusers folders.
                kohya_sd3 = self.cfg.trainer == "kohya" and str(args.get("script") or "").startswith("sd3_")
                path, how = models.stage(self.cfg.model, self.store, self.workdir,
                                         hub_token=models.hub_token(self.store, self.cfg.run_prefix),
                                         single_file=kohya_sd3)
                ph.result = how
        except Exception as exc:  # noqa: BLE001 - any fetch error is this host's boot failure
            raise Failure(f"staging the model {self.cfg.model} failed: {exc}", boot_phase="model") from exc
        if self.cfg.model == "tiny" and self.cfg.trainer == "builtin":
            # The folder holds the same tiny pipeline the builtin trainer builds at 32 px.
            args = self.cfg.trainer_args
            if isinstance(args, dict) and "resolution" not in args:
                self.cfg.trainer_args = {**args, "resolution": 32}
            elif isinstance(args, list) and "--resolution" not in args:
                self.cfg.trainer_args = [*args, "--resolution", "32"]
        return path

    def _stage_trainer_sources(self):
        """kohya sd-scripts or the diffusers examples on this host (boot phase "trainer"), from the
        bucket's cache/trainers/ or fetched with git and cached once; None when the run brings its
        own launcher or script (or its trainer is not an external one)."""
        from . import scripts

        if not scripts.needed(self.cfg.trainer, self.cfg.trainer_args):
            return None
        try:
            with self.phases.phase("trainer") as ph:
                bucket_only = self.cfg.network.get("trainer_sources") == "bucket"  # never GitHub (network.py)
                src = scripts.stage(self.cfg.trainer, self.store, self.workdir,
                                    {**self.cfg.trainer_sources, "bucket_only": bucket_only})
                ph.result = src.how
        except Exception as exc:  # any fetch or install error is this host's boot failure
            raise Failure(f"putting the {self.cfg.trainer} trainer on this host failed: {exc}",
                          boot_phase="trainer") from exc
        log.info("trainer %s: sources %s (%s), python %s", self.cfg.trainer, src.tree, src.how, src.python)
        return src

    def _stage_bucket_model(self, model: str) -> str:
        """A base model in a bucket (a diffusers folder or one .safetensors file) is copied to
        local disk like the dataset; the trainer gets the local path."""
        if not staging.is_remote(model):
            return model
        self.status.set_phase("staging")
        opts = {k: v for k, v in self.cfg.store.items() if k != "url"}
        dest = self.workdir / "model"
        try:
            if model.lower().endswith((".safetensors", ".ckpt")):
                parent, name = model.rsplit("/", 1)
                dest.mkdir(parents=True, exist_ok=True)
                src = open_store({"url": parent, **opts})
                retry(lambda: src.get_file(name, dest / name), what=f"download of {name}", log=log.warning)
                return str(dest / name)
            return str(staging.stage(model.rstrip("/"), dest, opts).path)
        except (StoreError, OSError) as exc:
            raise Failure(f"staging the model {model} failed: {exc}") from exc
