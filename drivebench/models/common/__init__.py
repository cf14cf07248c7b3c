"""Building blocks shared by the camera models: image backbone + FPN, focal loss."""
