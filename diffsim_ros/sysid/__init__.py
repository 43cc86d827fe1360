"""System identification: datasets, filters, parameterizations, losses and estimators (no ROS)."""
