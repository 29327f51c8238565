enum FanoutCorePlaceholder {}
