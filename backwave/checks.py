"""System checks for BackWave's settings (ids backwave.E0xx / W0xx)."""
