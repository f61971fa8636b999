pretrain_gpt.py --num-layers 80 --hidden-size 8192 --num-attention-heads 64 --seq-length 4096 --bf16
