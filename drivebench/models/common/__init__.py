"""Building blocks shared by the camera models: image backbone + FPN, focal loss, Sparse4D's MLP/FFN bricks."""
