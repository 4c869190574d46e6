"""The configuration: one module per YAML section, `schema.py` the whole file and its loading.

Import what you need from here (`from edge_runtime.config import Config, CameraConfig`), as
Frigate's `frigate/config/__init__.py` does; modules inside this folder import each other directly.
"""

from edge_runtime.config.api import ApiConfig
from edge_runtime.config.cameras import CameraConfig, CsiConfig, TriggerConfig
from edge_runtime.config.governor import GovernorConfig, JetsonActions
from edge_runtime.config.inspection import ImageLimits, InspectionConfig
from edge_runtime.config.journal import EvidenceConfig, JournalConfig
from edge_runtime.config.model import DEFAULT_PROVIDERS, ModelConfig
from edge_runtime.config.mqtt import HomeAssistantConfig, MqttConfig, TlsConfig
from edge_runtime.config.ota import OtaConfig
from edge_runtime.config.programs import ProgramConfig, ReferenceConfig
from edge_runtime.config.rails import RailsConfig
from edge_runtime.config.schema import (
           MAX_CONFIG_BYTES,
           Config,
           config_schema,
           default_data_dir,
           load_config,
           parse_config,
)

__all__ = ["DEFAULT_PROVIDERS", "MAX_CONFIG_BYTES", "ApiConfig", "CameraConfig", "Config", "CsiConfig",
           "EvidenceConfig", "GovernorConfig", "HomeAssistantConfig", "ImageLimits", "InspectionConfig",
           "JetsonActions", "JournalConfig", "ModelConfig", "MqttConfig", "OtaConfig", "ProgramConfig", "RailsConfig",
           "ReferenceConfig", "TlsConfig",
           "TriggerConfig", "config_schema", "default_data_dir", "load_config", "parse_config"]
