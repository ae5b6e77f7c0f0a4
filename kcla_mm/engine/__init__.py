from .checkpoint_safety import allow_mmengine_checkpoint_types
from .config_utils import (check_pretrained_files, cpu_distributed_defaults,
                           init_distributed_on_cpu, load_config,
                           set_data_root)

__all__ = [
    'allow_mmengine_checkpoint_types', 'check_pretrained_files',
    'cpu_distributed_defaults', 'init_distributed_on_cpu', 'load_config',
    'set_data_root'
]
