# Llama-2-70B as a launch script passes it
torchrun --nproc_per_node 8 --nnodes 8 pretrain_gpt.py \
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --sequence-parallel \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --num-layers 80 --hidden-size 8192 --num-attention-heads 64 \
    --group-query-attention --num-query-groups 8 --seq-length 4096 \
    --micro-batch-size 1 --global-batch-size 64 --recompute-activations \
    --bf16 --use-flash-attn --lr 3e-4 --data-path '/data/my corpus' --log-interval=10
