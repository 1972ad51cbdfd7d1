package nn_test

import (
	"context"
	"fmt"

	"github.com/jetfabric/jetfabric/client"
	"github.com/jetfabric/jetfabric/kernels"
	"github.com/jetfabric/jetfabric/nn"
)

// A classifier built of layers, trained with AdamW and saved in the
// safetensors format under PyTorch's state_dict names ("0.weight", ...),
// so torch.nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Dropout(0.1),
// nn.Linear(128, 10)).load_state_dict takes the file.
func Example_training() {
	ctx := context.Background()
	c, err := client.Connect("nats://localhost:4222")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	s, err := c.Open(ctx, "cpu-0")
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)

	s.Seed(42) // fixes the initial weights, drawn on the worker
	l1, _ := nn.NewLinear(s, 784, 128)
	l2, _ := nn.NewLinear(s, 128, 10)
	model := nn.NewSequential(l1, nn.ReLU{}, nn.NewDropout(0.1), l2)
	opt := nn.NewAdamW(1e-3)

	var images, labels [][]byte // batches of 64 f32 images and i64 labels
	for i := range images {
		x, _ := nn.Upload(ctx, s, kernels.Float32, []int{64, 784}, images[i])
		y, _ := nn.Upload(ctx, s, kernels.Int64, []int{64}, labels[i])
		logits, err := model.Forward(x)
		if err != nil {
			panic(err) // a wrong input shape, named with the layer
		}
		loss := nn.CrossEntropy(logits, y, nn.ReduceMean)
		if err := nn.Backward(loss); err != nil {
			panic(err)
		}
		if err := opt.Step(model.Params()); err != nil {
			panic(err)
		}
		if i%100 == 0 {
			v, _ := loss.Item(ctx)
			fmt.Println("loss", v)
		}
		loss.Free()
		x.Free()
		y.Free()
	}
	model.Train(false) // dropout off for evaluation
	if err := nn.Save(ctx, "model.safetensors", model.Params()); err != nil {
		panic(err)
	}
}
