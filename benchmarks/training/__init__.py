"""Training benchmarks: LM perplexity vs a unigram model, CIFAR-10 accuracy, 2-process vs 1-process throughput."""
