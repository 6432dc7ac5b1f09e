"""Node side: health score, push to Fleet, self-classification and events."""
