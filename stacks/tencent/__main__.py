"""Pulumi entry point for the sdcloud Tencent Cloud stack: read the config, build, export the outputs."""

import pulumi

from sdcloud_tencent_stack import build, load_config

for name, value in build(load_config()).items():
    pulumi.export(name, value)
