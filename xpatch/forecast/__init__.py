"""Forecast samples: inputs and targets taken by time label around each valid origin."""
