"""The experiment trackers of train/tracking.py, each registered in TRACKERS: TensorBoard
event files (log.tensorboard), Weights & Biases (log.wandb.mode), MLflow
(log.mlflow.tracking_uri). Each imports its package only when its run starts."""
from agentjax.train.trackers import mlflow_run, tensorboard_events, wandb_run

__all__ = ["mlflow_run", "tensorboard_events", "wandb_run"]
