# pipeline 4, tensor 8; context parallelism is refused
python pretrain_gpt.py --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 \
  --micro-batch-size 2 --global-batch-size 512 --fp16 --context-parallel-size 2
