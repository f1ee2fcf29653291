package daemon

import (
	"testing"

	"github.com/condfs/condfs/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }
