from .config_utils import (add_runner_arguments, check_pretrained_files,
                           close_distributed, cpu_distributed_defaults,
                           export_local_rank, init_distributed_on_cpu,
                           load_config, set_data_root)
from .publish import (CheckpointPublishError, publish_checkpoint,
                      release_name, sha256sum)

__all__ = [
    'add_runner_arguments',
    'CheckpointPublishError', 'publish_checkpoint', 'release_name',
    'sha256sum',
    'check_pretrained_files', 'close_distributed',
    'cpu_distributed_defaults', 'export_local_rank',
    'init_distributed_on_cpu', 'load_config', 'set_data_root'
]
