"""The matrix file: a strict schema, and a loader whose only failure is ConfigError.

Every model forbids unknown keys so that a typo in YAML (``repeat:`` for ``repeats:``) fails
loudly instead of silently running the default. Paths in the file are relative to the file.

One module per part of the file, in the order a run reads them: what is served (served), what
is sent (workload, with the contract probes' own fields from bench.core.probes), how cells are
compared (comparison), how servers start (server), where (platform), which settings must not
change answers (knobs), the file as a whole (matrix) and the command line's changes to it
(overrides).
"""

from bench.core.config.comparison import DEFAULT_PASSAGE, BaselineRule, CellFilter, Comparison, ReferenceText
from bench.core.config.knobs import BUILTIN_KNOBS, Invariance, Knob
from bench.core.config.matrix import IMAGE_FIELDS_NEEDED, Config, LauncherName, format_error, parse_config
from bench.core.config.overrides import parse_devices, with_devices, with_image_refs, with_repeats
from bench.core.config.platform import DEVICE_ID, Budget, CpuFlags, Detect, Platform, PlatformKnob
from bench.core.config.served import Image, LoadFormat, Model
from bench.core.config.server import TOPOLOGY_ENV, DockerOptions, ServerSettings, SlurmProfile, Topology, Ulimit
from bench.core.config.workload import Expect, Message, Prompt, RequestShape, Workload
from bench.core.schema import ENV_NAME, NAME, ConfigError, Name, ServerArgs, Strict

__all__ = [
    "BUILTIN_KNOBS", "DEFAULT_PASSAGE", "DEVICE_ID", "ENV_NAME", "IMAGE_FIELDS_NEEDED", "NAME", "TOPOLOGY_ENV",
    "BaselineRule", "Budget", "CellFilter", "Comparison", "Config", "ConfigError", "CpuFlags", "Detect",
    "DockerOptions", "Expect", "Image", "Invariance", "Knob", "LauncherName", "LoadFormat", "Message", "Model",
    "Name", "Platform", "PlatformKnob", "Prompt", "ReferenceText", "RequestShape", "ServerArgs", "ServerSettings",
    "SlurmProfile", "Strict", "Topology", "Ulimit", "Workload", "format_error", "parse_config", "parse_devices",
    "with_devices", "with_image_refs", "with_repeats",
]
